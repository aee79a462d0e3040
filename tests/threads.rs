//! Ranks as threads of one process: the in-process transport and forced TCP under proptest,
//! split, abort, and strangers on every listening port.

use proptest::prelude::*;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};
use strata::check;
use strata::{
    CallSpec, Collective, Communicator, DataType, Error, ReduceOp, Transfer, TransportPolicy,
};

mod in_process;
use in_process::*;

/// Communicators kept across proptest cases (building them per case would dominate).
fn pool(transport: TransportPolicy) -> &'static Vec<Vec<Communicator>> {
    static INPROC: OnceLock<Vec<Vec<Communicator>>> = OnceLock::new();
    static TCP: OnceLock<Vec<Vec<Communicator>>> = OnceLock::new();
    let cell = if transport == TransportPolicy::Tcp {
        &TCP
    } else {
        &INPROC
    };
    cell.get_or_init(|| (1..=6).map(|n| init_threads(n, transport)).collect())
}

const COLLECTIVES: [Collective; 8] = Collective::WITH_BUFFERS;

fn shape() -> impl Strategy<Value = (usize, usize, usize, usize, usize, usize, bool)> {
    // (ranks-1, collective, dtype, op, count, root seed, in place)
    (
        0usize..6,
        0usize..8,
        0usize..12,
        0usize..6,
        0usize..20_000,
        0usize..64,
        any::<bool>(),
    )
}

fn run_case(
    transport: TransportPolicy,
    (ni, ci, di, oi, count, root, in_place): (usize, usize, usize, usize, usize, usize, bool),
) -> Result<(), String> {
    let comms = &pool(transport)[ni];
    let dtype = DataType::ALL[di];
    let op = match oi {
        5 => ReduceOp::PreMulSum(check::premul_scalar(dtype, 0)),
        k => ReduceOp::BASIC[k],
    };
    let spec = CallSpec {
        collective: COLLECTIVES[ci],
        dtype,
        count,
        op,
        root: root % comms.len(),
    };
    on_all(comms, |c| checked_call(c, spec, in_place))
        .into_iter()
        .collect::<Result<Vec<()>, String>>()
        .map(|_| ())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn random_shapes_in_process(case in shape()) {
        let r = run_case(TransportPolicy::Auto, case);
        prop_assert!(r.is_ok(), "{:?}", r);
    }

    #[test]
    fn random_shapes_over_tcp(case in shape()) {
        let r = run_case(TransportPolicy::Tcp, case);
        prop_assert!(r.is_ok(), "{:?}", r);
    }
}

#[test]
fn split_makes_working_subcommunicators() {
    let comms = init_threads(5, TransportPolicy::Auto);
    let out = on_all(&comms, |comm| {
        let color = if comm.rank() == 4 {
            None
        } else {
            Some((comm.rank() % 2) as u32)
        };
        let sub = comm.split(color, -(comm.rank() as i32)).unwrap();
        sub.map(|s| {
            let mut v = [comm.rank() as u64];
            s.all_reduce_in_place(&mut v, ReduceOp::Sum).unwrap();
            (s.rank(), s.size(), v[0])
        })
    });
    // Evens 0,2 and odds 1,3; key = -rank orders them in reverse; rank 4 opts out.
    assert_eq!(
        out,
        vec![
            Some((1, 2, 2)),
            Some((1, 2, 4)),
            Some((0, 2, 2)),
            Some((0, 2, 4)),
            None
        ]
    );
}

#[test]
fn split_layout_builds_the_four_groups_in_tp_cp_pp_dp_order() {
    use strata::algorithms::layout::Layout;
    let comms = init_threads(8, TransportPolicy::Auto);
    let layout = Layout::new(2, 2, 1, 2).unwrap();
    let out = on_all(&comms, |comm| {
        let g = comm.split_layout(&layout).unwrap();
        // Each group sums 2^rank over its members, which names them exactly.
        let mask = |c: &strata::Communicator| {
            let mut v = [1u64 << comm.rank()];
            c.all_reduce_in_place(&mut v, ReduceOp::Sum).unwrap();
            (c.size(), v[0])
        };
        [mask(&g.tp), mask(&g.cp), mask(&g.pp), mask(&g.dp)]
    });
    // Rank 0: TP {0,1}, CP {0,2}, PP {0}, DP {0,4}. Rank 7: TP {6,7}, CP {5,7}, DP {3,7}.
    assert_eq!(out[0], [(2, 0b11), (2, 0b101), (1, 0b1), (2, 0b1_0001)]);
    assert_eq!(
        out[7],
        [
            (2, 0b1100_0000),
            (2, 0b1010_0000),
            (1, 0b1000_0000),
            (2, 0b1000_1000)
        ]
    );
    // A layout of the wrong size is refused on every rank, before any split.
    let bad = Layout::new(2, 2, 2, 2).unwrap();
    let errs = on_all(&comms, |comm| comm.split_layout(&bad).is_err());
    assert!(errs.iter().all(|e| *e));
}

#[test]
fn abort_unblocks_a_call_waiting_on_a_peer_within_one_second() {
    let comms = Arc::new(init_threads(2, TransportPolicy::Auto));
    // Rank 1 never calls all_reduce: rank 0 waits on it until aborted.
    let c2 = comms.clone();
    let waiter = std::thread::spawn(move || {
        let mut v = vec![1f32; 1 << 20];
        let r = c2[0].all_reduce_in_place(&mut v, ReduceOp::Sum);
        (r, Instant::now())
    });
    std::thread::sleep(Duration::from_millis(300));
    let aborted_at = Instant::now();
    comms[0].abort();
    let (r, returned_at) = waiter.join().unwrap();
    assert!(matches!(r, Err(Error::Aborted(_))), "{r:?}");
    assert!(
        returned_at - aborted_at < Duration::from_secs(1),
        "took {:?}",
        returned_at - aborted_at
    );
    assert!(comms[0].async_error().is_some());
    assert!(comms[1].async_error().is_none());
}

#[test]
fn strangers_on_every_port_are_ignored() {
    use std::io::Write;
    let id = loopback_id();
    // Garbage, a truncated hello, a length field of 4 GiB, and a complete hello answered
    // with a proof made without the job's secret.
    let mut wrong_secret = b"STRATAHS".to_vec();
    wrong_secret.extend_from_slice(&[7; 16 + 32]);
    let payloads: [&[u8]; 7] = [
        b"GET / HTTP/1.0\r\n\r\n",
        &[0xff; 64],
        b"STRATAHS",
        b"STRAT",
        &[0xff, 0xff, 0xff, 0xff, b'{'],
        &wrong_secret,
        &[],
    ];
    let poke = |addr: std::net::SocketAddr, keep: &mut Vec<std::net::TcpStream>| {
        for p in payloads {
            if let Ok(mut s) = std::net::TcpStream::connect(addr) {
                let _ = s.write_all(p);
                keep.push(s);
            }
        }
    };
    let mut junk = Vec::new();
    poke(id.root_addr(), &mut junk);
    let comms = init_threads_with(id, 3, TransportPolicy::Tcp);
    for c in &comms {
        poke(c.peers()[c.rank()].listen, &mut junk);
    }
    for _ in 0..3 {
        let out = on_all(&comms, |c| {
            let mut v = vec![c.rank() as i32 + 1; 5000];
            c.all_reduce_in_place(&mut v, ReduceOp::Max).unwrap();
            v[4999]
        });
        assert_eq!(out, vec![3, 3, 3]);
    }
    assert!(comms.iter().all(|c| c.async_error().is_none()));
}

#[test]
fn bad_arguments_are_rejected_before_any_traffic() {
    let comms = init_threads(2, TransportPolicy::Auto);
    let c = &comms[0];
    let mut small = vec![0f32; 3];
    assert!(matches!(
        c.all_reduce(&[1f32; 4], &mut small, ReduceOp::Sum),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        c.broadcast_in_place(&mut small, 2),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(c.send(&[1u8], 0), Err(Error::InvalidArgument(_))));
    assert!(matches!(c.send(&[1u8], 7), Err(Error::InvalidArgument(_))));
    assert!(matches!(
        c.all_gather(&[1u8; 2], &mut [0u8; 3]),
        Err(Error::InvalidArgument(_))
    ));
    let huge = CallSpec::new(Collective::AllGather, DataType::Float64, usize::MAX / 4);
    assert!(matches!(
        c.call_bytes(huge, None, &mut []),
        Err(Error::InvalidArgument(_))
    ));
    let wrong_scalar = ReduceOp::PreMulSum(strata::Scalar::new(2i32));
    assert!(matches!(
        c.all_reduce_in_place(&mut small, wrong_scalar),
        Err(Error::InvalidArgument(_))
    ));
    // Nothing was sent: both ranks still work together.
    let out = on_all(&comms, |c| {
        let mut v = [1u8];
        c.all_reduce_in_place(&mut v, ReduceOp::Sum).unwrap();
        v[0]
    });
    assert_eq!(out, vec![2, 2]);
}

#[test]
fn leaving_right_after_the_last_call_does_not_fail_slower_peers() {
    // A rank may leave a barrier (and drop its communicator, saying goodbye) while a slower
    // peer still has that rank's last message to read; the peer must finish normally.
    for round in 0..100 {
        let comms = init_threads(8, TransportPolicy::Auto);
        let results = std::thread::scope(|s| {
            let hs: Vec<_> = comms
                .into_iter()
                .map(|c| {
                    s.spawn(move || {
                        let r = (0..3).try_for_each(|_| c.barrier());
                        drop(c);
                        r
                    })
                })
                .collect();
            hs.into_iter()
                .map(|h| h.join().unwrap())
                .collect::<Vec<_>>()
        });
        for (rank, r) in results.iter().enumerate() {
            assert!(r.is_ok(), "round {round}, rank {rank}: {r:?}");
        }
    }
}

#[test]
fn the_tuner_explains_its_choice_and_tuning_rules_override_it() {
    let comms = init_threads(4, TransportPolicy::Auto);
    let big = 64 << 20;
    let e = comms[0].explain(Collective::AllReduce, big);
    // The cheapest, or a ring the runtime slices that is priced within 1% of it.
    let price = |a| {
        e.ranked
            .iter()
            .find(|p| p.algorithm == a)
            .and_then(|p| p.seconds.clone().ok())
            .unwrap()
    };
    let best = price(e.ranked[0].algorithm);
    if e.chosen != e.ranked[0].algorithm {
        assert_eq!(e.chosen, strata::Algorithm::Ring, "{}", e.render());
        assert!(e.reason.contains("slice by slice"), "{}", e.render());
    }
    assert!(price(e.chosen) <= best * 1.01, "{}", e.render());
    let choices = on_all(&comms, |c| c.algorithm_for(Collective::AllReduce, big));
    assert!(choices.iter().all(|a| *a == e.chosen), "{choices:?}");
    let ring = comms[0]
        .predict(Collective::AllReduce, strata::Algorithm::Ring, 1 << 20)
        .unwrap();
    assert!(ring > 0.0 && ring < 1.0, "{ring}");
    // A rule pins 1 KiB..=1 MiB all-reduces to the double binary tree; the call runs it.
    let mut c = cfg(TransportPolicy::Auto);
    c.tuning_rules = strata::tuning::parse_rules(
        r#"{"rules": [{"collective": "all_reduce", "min_bytes": 1024, "max_bytes": 1048576, "algorithm": "tree"}]}"#,
    )
    .unwrap();
    let id = loopback_id();
    let ruled: Vec<Communicator> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..2)
            .map(|r| {
                let c = c.clone();
                s.spawn(move || Communicator::init_with_config(&id, 2, r, c).unwrap())
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(
        ruled[0].algorithm_for(Collective::AllReduce, 4096),
        strata::Algorithm::Tree
    );
    assert!(
        ruled[0]
            .explain(Collective::AllReduce, 4096)
            .reason
            .contains("tuning file")
    );
    let sums = on_all(&ruled, |c| {
        let send = vec![1f32; 1024];
        let mut recv = vec![0f32; 1024];
        c.all_reduce(&send, &mut recv, ReduceOp::Sum).unwrap();
        recv[1023]
    });
    assert_eq!(sums, vec![2.0, 2.0]);
}

/// A ring shift of 4 MiB per rank (far more than a transport buffers), two messages to the
/// same peer, a transfer to self and a zero-length one, all in one batch on every rank; then
/// a mismatched batch fails with an error naming both sides.
fn batch_exchange(transport: TransportPolicy) {
    let comms = init_threads(3, transport);
    let out = on_all(&comms, |c| {
        let (r, p) = (c.rank(), c.size());
        let (next, prev) = ((r + 1) % p, (r + p - 1) % p);
        let big: Vec<u8> = (0..4 << 20).map(|i| (i * 7 + r) as u8).collect();
        let small = [r as u32 * 10, r as u32 * 10 + 1];
        let mine = [r as f64; 3];
        let (mut got_big, mut got_small, mut got_self) = (vec![0u8; 4 << 20], [0u32; 2], [0f64; 3]);
        let mut got_second = [0u32; 2];
        c.send_recv(&mut [
            Transfer::Recv {
                peer: prev,
                dtype: DataType::Uint8,
                data: &mut got_big,
            },
            Transfer::Send {
                peer: next,
                dtype: DataType::Uint8,
                data: &big,
            },
            Transfer::Send {
                peer: next,
                dtype: DataType::Uint32,
                data: bytemuck::cast_slice(&small),
            },
            Transfer::Recv {
                peer: prev,
                dtype: DataType::Uint32,
                data: bytemuck::cast_slice_mut(&mut got_small),
            },
            Transfer::Send {
                peer: r,
                dtype: DataType::Float64,
                data: bytemuck::cast_slice(&mine),
            },
            Transfer::Recv {
                peer: r,
                dtype: DataType::Float64,
                data: bytemuck::cast_slice_mut(&mut got_self),
            },
            Transfer::Send {
                peer: next,
                dtype: DataType::Uint32,
                data: &[],
            },
            Transfer::Recv {
                peer: prev,
                dtype: DataType::Uint32,
                data: &mut [],
            },
        ])
        .unwrap();
        // A second exchange the other way round, unbatched on even ranks.
        if r % 2 == 0 {
            c.send(&small, prev).unwrap();
            c.recv(&mut got_second, next).unwrap();
        } else {
            c.send_recv(&mut [
                Transfer::Recv {
                    peer: next,
                    dtype: DataType::Uint32,
                    data: bytemuck::cast_slice_mut(&mut got_second),
                },
                Transfer::Send {
                    peer: prev,
                    dtype: DataType::Uint32,
                    data: bytemuck::cast_slice(&small),
                },
            ])
            .unwrap();
        }
        let want_big: Vec<u8> = (0..4 << 20).map(|i| (i * 7 + prev) as u8).collect();
        assert!(
            got_big == want_big,
            "rank {r}: the 4 MiB message from rank {prev} is wrong"
        );
        assert_eq!(got_small, [prev as u32 * 10, prev as u32 * 10 + 1]);
        assert_eq!(got_self, mine);
        assert_eq!(got_second, [next as u32 * 10, next as u32 * 10 + 1]);
        // Rank 0 receives f32 where rank 2 sends i32: both fail, naming both calls.
        let send = [1i32; 4];
        let mut recv = [0f32; 4];
        c.send_recv(&mut [
            Transfer::Send {
                peer: next,
                dtype: DataType::Int32,
                data: bytemuck::cast_slice(&send),
            },
            Transfer::Recv {
                peer: prev,
                dtype: if r == 0 {
                    DataType::Float32
                } else {
                    DataType::Int32
                },
                data: bytemuck::cast_slice_mut(&mut recv),
            },
        ])
        .err()
        .map(|e| e.to_string())
    });
    assert!(
        out[0]
            .as_deref()
            .is_some_and(|e| e.contains("int32") && e.contains("float")),
        "{out:?}"
    );
}

#[test]
fn batched_send_recv_in_process() {
    batch_exchange(TransportPolicy::Auto);
}

#[test]
fn batched_send_recv_over_tcp() {
    batch_exchange(TransportPolicy::Tcp);
}

#[test]
fn a_lone_send_to_self_is_an_error_not_a_hang() {
    let comms = init_threads(1, TransportPolicy::Auto);
    let e = comms[0].send(&[1u8], 0).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    assert!(e.to_string().contains("receives 0"), "{e}");
}

/// Ranks configured to cut the ring differently (one runs it block by block, the others in
/// 64 KiB slices) fail with a mismatch that names the slice, instead of exchanging
/// misaligned slices.
#[test]
fn ranks_that_would_slice_the_ring_differently_fail_with_a_mismatch() {
    let n = 3;
    let comms = init_threads_configured(loopback_id(), n, |r| {
        let mut c = cfg(TransportPolicy::Auto);
        c.ring_pipeline_bytes = if r == 1 { 0 } else { 1 };
        c.timeout = Duration::from_secs(20);
        c
    });
    for c in &comms {
        c.set_algorithm(Collective::AllReduce, Some(strata::Algorithm::Ring))
            .unwrap();
    }
    let results = on_all(&comms, |c| {
        let mut buf = vec![1f32; n * (200 << 10) / 4];
        c.all_reduce_in_place(&mut buf, ReduceOp::Sum)
    });
    let mut named = 0;
    for (r, result) in results.into_iter().enumerate() {
        match result {
            Err(Error::Mismatch(m)) => {
                assert!(m.contains("slices of 16384"), "rank {r}: {m}");
                named += 1;
            }
            Err(e) => assert!(
                matches!(e, Error::PeerFailed { .. } | Error::Aborted(_)),
                "rank {r}: {e}"
            ),
            Ok(()) => panic!("rank {r} finished a ring its peers cut differently"),
        }
    }
    assert!(named >= 2, "the mismatch was named on {named} ranks");
}

/// The ring all-reduce run slice by slice (64 KiB slices, blocks of three to four of them,
/// uneven across ranks) is exact for every type class and for the ops that finalize (avg) or
/// do not add (max), in and out of place, over the in-process transport and TCP.
#[test]
fn sliced_ring_all_reduce_is_exact() {
    for transport in [TransportPolicy::Auto, TransportPolicy::Tcp] {
        for n in [2, 3, 5] {
            let comms = init_threads_configured(loopback_id(), n, |_| {
                let mut c = cfg(transport);
                // The smallest budget gives the smallest slice.
                c.ring_pipeline_bytes = 1;
                c
            });
            for c in &comms {
                assert_eq!(c.ring_slice_bytes(n * (200 << 10)), 64 << 10);
                c.set_algorithm(Collective::AllReduce, Some(strata::Algorithm::Ring))
                    .unwrap();
            }
            let results = on_all(&comms, |c| {
                for dtype in [DataType::Float32, DataType::Bfloat16, DataType::Int64] {
                    let count = n * (200 << 10) / dtype.size() + 3;
                    for op in [ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max] {
                        all_reduce_both_ways(c, dtype, count, op, &format!("{transport:?} {n}"))?;
                    }
                }
                Ok::<(), String>(())
            });
            for r in results {
                r.unwrap();
            }
        }
    }
}

/// With `send_ahead`, every collective under every algorithm that can run it is exact at 2, 3
/// and 5 ranks, in and out of place, with counts that split unevenly, over the in-process
/// transport and TCP, and the ring all-reduce also run slice by slice; sum and avg (which
/// finalizes between steps, so its sends must not run ahead of the division). Every rank
/// sent bytes ahead, so the path was taken.
#[test]
fn sent_ahead_schedules_are_exact() {
    for transport in [TransportPolicy::Auto, TransportPolicy::Tcp] {
        for n in [2, 3, 5] {
            for pipeline in [0, 1] {
                let comms = init_threads_configured(loopback_id(), n, |_| {
                    let mut c = cfg(transport);
                    c.send_ahead = true;
                    c.ring_pipeline_bytes = pipeline;
                    c
                });
                let results = on_all(&comms, |c| {
                    for collective in COLLECTIVES {
                        for &algorithm in strata::algorithms::algorithms_for(collective) {
                            c.set_algorithm(collective, Some(algorithm))
                                .map_err(|e| e.to_string())?;
                            for count in [n * 3000 + 7, 70_001] {
                                for op in [ReduceOp::Sum, ReduceOp::Avg] {
                                    let spec = CallSpec {
                                        collective,
                                        dtype: DataType::Float32,
                                        count,
                                        op,
                                        root: n - 1,
                                    };
                                    for in_place in [false, true] {
                                        checked_call(c, spec, in_place).map_err(|e| {
                                            format!(
                                                "{transport:?} {n} ranks, {algorithm}: {spec:?}, \
                                                 in place {in_place}: {e}"
                                            )
                                        })?;
                                    }
                                }
                            }
                        }
                        c.set_algorithm(collective, None)
                            .map_err(|e| e.to_string())?;
                    }
                    Ok::<u64, String>(c.bytes_sent_ahead())
                });
                for (r, sent) in results.into_iter().enumerate() {
                    let sent = sent.unwrap();
                    assert!(
                        sent > 0,
                        "{transport:?} {n} ranks: rank {r} sent nothing ahead"
                    );
                }
            }
        }
    }
}

/// Where the model prices two algorithms alike (rd and one_shot for 8 bytes on 2 ranks: the
/// same single exchange), the first calls of the size class alternate them, the ranks agree
/// on the faster with one all-reduce of two doubles, and from then on every rank runs the
/// same one, which `algorithm_for` reports. An explicit choice and `tuner_trials = false`
/// run no trial.
#[test]
fn a_near_tie_is_timed_in_the_first_calls_and_every_rank_keeps_the_same_winner() {
    let bytes = 8;
    let run = |comms: &[Communicator], calls: usize| -> Vec<Vec<String>> {
        on_all(comms, |c| {
            let before = c.flight_records().len();
            for i in 0..calls {
                let send = [c.rank() as f32 + i as f32, 1.0];
                let mut recv = [0f32; 2];
                c.all_reduce(&send, &mut recv, ReduceOp::Sum).unwrap();
                let want = (0..c.size()).map(|r| r as f32 + i as f32).sum::<f32>();
                assert_eq!(recv, [want, c.size() as f32], "call {i}");
            }
            c.flight_records()[before..]
                .iter()
                .map(|r| r.op.clone())
                .collect()
        })
    };
    let comms = init_threads(2, TransportPolicy::Auto);
    let e = comms[0].explain(Collective::AllReduce, bytes);
    let priced = |i: usize| *e.ranked[i].seconds.as_ref().unwrap();
    assert!(
        priced(1) <= priced(0) * (1.0 + strata::algorithms::tuner::NEAR_TIE),
        "the premise: a near tie at 8 B on 2 ranks\n{}",
        e.render()
    );
    // The trial's algorithms: those priced within NEAR_TIE of the cheapest, up to TRIAL_MAX,
    // each distinct price (within PRICED_ALIKE) first, in price order. Here: rd and one_shot,
    // priced alike, so both.
    use strata::algorithms::tuner::{NEAR_TIE, PRICED_ALIKE, TRIAL_MAX};
    let within: Vec<(strata::Algorithm, f64)> = e
        .ranked
        .iter()
        .map_while(|r| match r.seconds {
            Ok(t) if t <= priced(0) * (1.0 + NEAR_TIE) => Some((r.algorithm, t)),
            _ => None,
        })
        .collect();
    let mut taken: Vec<(strata::Algorithm, f64)> = Vec::new();
    for &(a, t) in &within {
        if taken.len() < TRIAL_MAX && taken.iter().all(|(_, v)| (t - v).abs() > PRICED_ALIKE * v) {
            taken.push((a, t));
        }
    }
    for &(a, t) in &within {
        if taken.len() < TRIAL_MAX && taken.iter().all(|(b, _)| *b != a) {
            taken.push((a, t));
        }
    }
    taken.sort_by(|x, y| x.1.total_cmp(&y.1));
    let rivals: Vec<strata::Algorithm> = taken.iter().map(|(a, _)| *a).collect();
    let trial_calls = comms[0].tuner_trial_calls(Collective::AllReduce, bytes);
    assert_eq!(
        trial_calls,
        strata::tuner_trial_calls(bytes, rivals.len()),
        "{rivals:?}"
    );
    let ops = run(&comms, trial_calls + 3);
    assert_eq!(
        ops[0].len(),
        trial_calls + 4,
        "the calls and one agreement: {:?}",
        ops[0]
    );
    let ran = |op: &str| {
        op.rsplit("; ")
            .next()
            .unwrap()
            .trim_end_matches(')')
            .to_string()
    };
    // Turns of two calls of one algorithm (one settles, one is timed), in price order.
    for (i, op) in ops[0][..trial_calls].iter().enumerate() {
        let turn = rivals[(i / 2) % rivals.len()];
        assert_eq!(ran(op), turn.name(), "call {i}: {op}");
    }
    let agreement = &ops[0][trial_calls];
    assert!(
        agreement.contains("double")
            && agreement.contains(&format!("{} elements", rivals.len()))
            && agreement.ends_with("; rd)"),
        "{agreement}"
    );
    let winner = comms[0].algorithm_for(Collective::AllReduce, bytes);
    assert!(rivals.contains(&winner));
    for c in &comms {
        assert_eq!(c.algorithm_for(Collective::AllReduce, bytes), winner);
    }
    for (r, rank_ops) in ops.iter().enumerate() {
        assert_eq!(rank_ops, &ops[0], "rank {r} ran what rank 0 ran");
        for op in &rank_ops[trial_calls + 1..] {
            assert_eq!(ran(op), winner.name(), "{op}");
        }
    }

    // An explicit choice: no trial.
    let comms = init_threads(2, TransportPolicy::Auto);
    on_all(&comms, |c| {
        c.set_algorithm(Collective::AllReduce, Some(strata::Algorithm::Ring))
            .unwrap()
    });
    assert_eq!(comms[0].tuner_trial_calls(Collective::AllReduce, bytes), 0);
    let ops = run(&comms, trial_calls + 2);
    assert_eq!(ops[0].len(), trial_calls + 2);
    assert!(ops[0].iter().all(|op| ran(op) == "ring"), "{:?}", ops[0]);

    // Trials off: the model's choice throughout.
    let comms = init_threads_configured(loopback_id(), 2, |_| {
        let mut c = cfg(TransportPolicy::Auto);
        c.tuner_trials = false;
        c
    });
    let ops = run(&comms, trial_calls + 2);
    assert_eq!(ops[0].len(), trial_calls + 2);
    assert!(
        ops[0].iter().all(|op| ran(op) == rivals[0].name()),
        "{:?}",
        ops[0]
    );
}
