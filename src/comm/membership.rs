//! Membership: split, revoke, shrink and the 4D layout's communicators.

use super::*;

impl Communicator {
    /// Splits into communicators of the ranks with the same `color`, ordered by `(key, rank)`.
    /// Ranks passing `None` take part but get no communicator. Every rank must call it.
    pub fn split(&self, color: Option<u32>, key: i32) -> Result<Option<Communicator>> {
        const REC: usize = 40;
        let listener = CommListener::bind(&self.inner.cfg)?;
        let listen = listener
            .local_addr()
            .map_err(|e| Error::io("listener address", e))?;
        let mut mine = [0u8; REC];
        mine[0..8].copy_from_slice(&color.map_or(-1i64, i64::from).to_le_bytes());
        mine[8..16].copy_from_slice(&(key as i64).to_le_bytes());
        match listen.ip() {
            IpAddr::V4(ip) => {
                mine[16] = 4;
                mine[18..22].copy_from_slice(&ip.octets());
            }
            IpAddr::V6(ip) => {
                mine[16] = 6;
                mine[18..34].copy_from_slice(&ip.octets());
            }
        }
        mine[34..36].copy_from_slice(&listen.port().to_le_bytes());
        let mut all = vec![0u8; REC * self.size()];
        self.all_gather(&mine, &mut all)?;
        let split_no = {
            let mut st = self.lock_state()?;
            st.splits += 1;
            st.splits
        };
        let Some(color) = color else { return Ok(None) };
        let mut members: Vec<(i64, usize, SocketAddr)> = Vec::new();
        for (r, rec) in all.chunks_exact(REC).enumerate() {
            let c = i64::from_le_bytes(rec[0..8].try_into().unwrap_or_default());
            if c != i64::from(color) {
                continue;
            }
            let k = i64::from_le_bytes(rec[8..16].try_into().unwrap_or_default());
            let port = u16::from_le_bytes([rec[34], rec[35]]);
            let ip = if rec[16] == 6 {
                IpAddr::from(<[u8; 16]>::try_from(&rec[18..34]).unwrap_or_default())
            } else {
                IpAddr::from(<[u8; 4]>::try_from(&rec[18..22]).unwrap_or_default())
            };
            members.push((k, r, SocketAddr::new(ip, port)));
        }
        members.sort_by_key(|m| (m.0, m.1));
        let peers: Vec<PeerInfo> = members
            .iter()
            .enumerate()
            .map(|(new, (_, old, listen))| PeerInfo {
                rank: new,
                listen: *listen,
                ..self.inner.peers[*old].clone()
            })
            .collect();
        let rank = members
            .iter()
            .position(|m| m.1 == self.rank())
            .ok_or_else(|| Error::Transport("internal: split lost this rank".into()))?;
        let label = format!("{}/split{split_no}/color{color}", self.inner.comm_id);
        let comm_id = comm_id_of(&self.inner.secret, label.as_bytes());
        let listener = Listening::start(
            listener,
            comm_id.clone(),
            rank,
            peers.len(),
            self.inner.secret,
            &self.inner.cfg,
        )?;
        self.child(rank, peers, comm_id, listener).map(Some)
    }

    /// A communicator made from this one: its own table and listener, this one's secret,
    /// configuration and fabric costs, and, to start with, this one's current algorithm
    /// choices and timeout.
    fn child(
        &self,
        rank: usize,
        peers: Vec<PeerInfo>,
        comm_id: String,
        listener: Listening,
    ) -> Result<Communicator> {
        let child = Self::from_parts(
            rank,
            peers,
            comm_id,
            self.inner.secret,
            self.inner.cfg.clone(),
            listener,
            self.inner.tiers.costs(),
        )?;
        for (mine, theirs) in child.inner.algo_choice.iter().zip(&self.inner.algo_choice) {
            mine.store(theirs.load(Ordering::Relaxed), Ordering::Relaxed);
        }
        child.set_timeout(self.timeout())?;
        Ok(child)
    }

    /// A communicator of the ranks `members` of this one (rank `i` of it is rank
    /// `members[i]` here), made by its members alone and with no message: each member builds
    /// the same table from this communicator's, and the new communicator is served by this
    /// one's listener, so nothing waits for anyone at creation. This is how a framework's
    /// sub-group is made when only its members take part (PyTorch's `new_group`), where
    /// [`Communicator::split`] needs every rank.
    ///
    /// Every member must call it with the same `members` and `tag`, and `tag` must be new
    /// among this communicator's live sub-communicators (PyTorch's group name is). Members
    /// that disagree make different communicators: within the handshake timeout their
    /// watchdogs report a mismatch naming the rank that never made this one, and their calls
    /// fail with it rather than compute with a wrong table.
    pub fn subgroup(&self, members: &[usize], tag: &str) -> Result<Communicator> {
        let p = self.size();
        let mut seen = vec![false; p];
        for &m in members {
            if m >= p || std::mem::replace(&mut seen[m], true) {
                return Err(Error::InvalidArgument(format!(
                    "sub-communicator members {members:?}: each must be a distinct rank below {p}"
                )));
            }
        }
        let rank = members
            .iter()
            .position(|&m| m == self.rank())
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "rank {} is not among the sub-communicator's members {members:?}",
                    self.rank()
                ))
            })?;
        let list: Vec<String> = members.iter().map(usize::to_string).collect();
        let label = format!("{}/group/{tag}/{}", self.inner.comm_id, list.join(","));
        let comm_id = comm_id_of(&self.inner.secret, label.as_bytes());
        let peers: Vec<PeerInfo> = members
            .iter()
            .enumerate()
            .map(|(new, &old)| PeerInfo {
                rank: new,
                ..self.inner.peers[old].clone()
            })
            .collect();
        let listener =
            self.inner
                .listener
                .attach(comm_id.clone(), rank, peers.len(), &self.inner.cfg)?;
        self.child(rank, peers, comm_id, listener)
    }

    /// Makes every rank's call in progress and every later call fail, as a fault would: the
    /// watchdog carries it to all ranks. Use it before [`Communicator::shrink`] so that no
    /// survivor is still inside a call of this communicator. Returns at once.
    pub fn revoke(&self) {
        let e = Error::Aborted(Some(format!(
            "rank {} revoked the communicator",
            self.rank()
        )));
        if self.inner.health.record_fault(&e) {
            tracing::warn!(rank = self.rank(), "{e}");
        }
    }

    /// A working communicator over the ranks of this one not in `exclude`, numbered in their
    /// old order (NCCL's `ncclCommShrink`). Only the survivors call it, each with the same
    /// `exclude`; the excluded ranks take no part, so this works after they died. The
    /// lowest survivor gathers everyone's new address through its listener of this
    /// communicator, which outlives faults. Fails after `STRATA_INIT_TIMEOUT` if a survivor
    /// never calls it.
    pub fn shrink(&self, exclude: &[usize]) -> Result<Communicator> {
        let inner = &*self.inner;
        let mut gone: Vec<usize> = exclude.to_vec();
        gone.sort_unstable();
        gone.dedup();
        if let Some(&bad) = gone.iter().find(|&&r| r >= inner.size) {
            return Err(Error::InvalidArgument(format!(
                "shrink: rank {bad} is not in this communicator of {} ranks",
                inner.size
            )));
        }
        if gone.contains(&inner.rank) {
            return Err(Error::InvalidArgument(format!(
                "shrink: this rank ({}) is in the exclude list; only survivors call shrink",
                inner.rank
            )));
        }
        let survivors: Vec<usize> = (0..inner.size).filter(|r| !gone.contains(r)).collect();
        let rank = survivors
            .iter()
            .position(|&r| r == inner.rank)
            .ok_or_else(|| Error::Transport("internal: shrink lost this rank".into()))?;
        let shrink_no = {
            // A call still running (on another thread) holds the state: interrupt it first.
            let mut st = match self.inner.state.try_lock() {
                Ok(st) => st,
                Err(_) => {
                    self.revoke();
                    self.lock_state()?
                }
            };
            st.shrinks += 1;
            st.shrinks
        };
        let key = format!("shrink{shrink_no}/without{gone:?}");
        let comm_id = comm_id_of(&inner.secret, format!("{}/{key}", inner.comm_id).as_bytes());
        let listener = CommListener::bind(&inner.cfg)?;
        let listen = listener
            .local_addr()
            .map_err(|e| Error::io("listener address", e))?;
        let mine = PeerInfo {
            rank,
            listen,
            ..inner.peers[inner.rank].clone()
        };
        let root = survivors[0];
        let deadline = Instant::now() + inner.cfg.init_timeout;
        let listener = Listening::start(
            listener,
            comm_id.clone(),
            rank,
            survivors.len(),
            inner.secret,
            &inner.cfg,
        )?;
        let peers = if root == inner.rank {
            inner
                .listener
                .shrink_join(&key, survivors.len(), mine, deadline)?
        } else {
            shrink::request(
                &inner.comm_id,
                inner.rank,
                &inner.peers[root],
                &inner.secret,
                &inner.cfg,
                &key,
                survivors.len(),
                mine,
            )?
        };
        tracing::info!(
            rank = inner.rank,
            "shrunk to {} ranks without {}",
            peers.len(),
            RankList(&gone)
        );
        self.child(rank, peers, comm_id, listener)
    }

    /// Splits this communicator into the four groups of a 4D parallel layout, in [TP, CP, PP,
    /// DP] order with TP varying fastest over this communicator's ranks (see
    /// [`strata_algorithms::layout`]). Every rank must call it with the same layout, whose
    /// world size must equal this communicator's size.
    pub fn split_layout(&self, layout: &Layout) -> Result<LayoutComms> {
        if layout.world() != self.size() {
            return Err(Error::InvalidArgument(format!(
                "{layout} does not match the {} ranks of this communicator",
                self.size()
            )));
        }
        let mut parts = Vec::with_capacity(4);
        for kind in GroupKind::ALL {
            let (color, key) = layout.color_and_key(kind, self.rank());
            let color = u32::try_from(color)
                .map_err(|_| Error::InvalidArgument(format!("{layout}: too many groups")))?;
            let comm = self.split(Some(color), key as i32)?.ok_or_else(|| {
                Error::Transport(format!("internal: the {kind} split left this rank out"))
            })?;
            parts.push(comm);
        }
        let [tp, cp, pp, dp]: [Communicator; 4] = parts
            .try_into()
            .map_err(|_| Error::Transport("internal: expected four layout splits".into()))?;
        Ok(LayoutComms { tp, cp, pp, dp })
    }
}
