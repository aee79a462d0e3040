//! Growing a communicator (NCCL's `ncclCommGetUniqueId` and `ncclCommGrow`): the ranks of
//! this one keep their numbers and new ranks join after them, through a rendezvous of its
//! own, so a job that shrank past a dead rank can take a spare back in.

use super::*;

impl Communicator {
    /// A new id for growing this communicator (NCCL's `ncclCommGetUniqueId`), made by the
    /// one rank that coordinates the growth (it passes it to [`Communicator::grow`]): it
    /// starts a rendezvous root in this process, on this communicator's interface, that
    /// serves one grown communicator until it is built or `STRATA_INIT_TIMEOUT` passes. Hand
    /// it to the new ranks by any means (its 128 bytes, or [`UniqueId::to_hex`]). Single use.
    pub fn grow_id(&self) -> Result<UniqueId> {
        let cfg = &self.inner.cfg;
        let secret = crate::wire::random_bytes()?;
        UniqueId::serve(SocketAddr::new(cfg.listen_ip, 0), secret, cfg.init_timeout)
    }

    /// A communicator of `new_size` ranks (NCCL's `ncclCommGrow`): this one's, keeping their
    /// numbers, then new ranks numbered from this one's size, which join with
    /// [`Communicator::init`]`(id, new_size, rank)`. Every rank of this communicator calls it:
    /// the one that made the id with [`Communicator::grow_id`] passes it, the others `None`
    /// (it reaches them through this communicator). No call may be in progress on it; it
    /// stays usable after. The grown one keeps its explicit algorithm choices. Every rank
    /// fails alike when no rank, or more than one, passes an id; it fails after
    /// `STRATA_INIT_TIMEOUT` if a rank never comes.
    pub fn grow(&self, id: Option<&UniqueId>, new_size: usize) -> Result<Communicator> {
        // Each rank's offer: a flag, then the id it holds or zeros. Every rank takes part,
        // even one that will fail, so that no one is left waiting.
        const OFFER: usize = 1 + bootstrap::UNIQUE_ID_BYTES;
        let mut mine = [0u8; OFFER];
        if let Some(id) = id {
            mine[0] = 1;
            mine[1..].copy_from_slice(id.as_bytes());
        }
        let mut all = vec![0u8; OFFER * self.size()];
        self.all_gather(&mine[..], &mut all)?;
        if new_size < self.size() {
            return Err(Error::InvalidArgument(format!(
                "grow to {new_size} ranks: the communicator already has {}",
                self.size()
            )));
        }
        let holders: Vec<usize> = (0..self.size()).filter(|r| all[r * OFFER] == 1).collect();
        let root = match holders.as_slice() {
            [r] => *r,
            [] => {
                return Err(Error::InvalidArgument(
                    "grow: no rank passed an id; the rank that made it with grow_id (NCCL: \
                     ncclCommGetUniqueId) passes it, the others pass none"
                        .into(),
                ));
            }
            many => {
                return Err(Error::InvalidArgument(format!(
                    "grow: {} each passed an id; exactly one may",
                    RankList(many)
                )));
            }
        };
        let id = UniqueId::from_bytes(&all[root * OFFER + 1..(root + 1) * OFFER])?;
        let child = Self::init_with_config(&id, new_size, self.rank(), self.inner.cfg.clone())?;
        for (mine, theirs) in child.inner.algo_choice.iter().zip(&self.inner.algo_choice) {
            mine.store(theirs.load(Ordering::Relaxed), Ordering::Relaxed);
        }
        Ok(child)
    }
}
