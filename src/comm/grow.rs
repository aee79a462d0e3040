//! Growing a communicator (NCCL's `ncclCommGetUniqueId` and `ncclCommGrow`): the ranks of
//! this one keep their numbers and new ranks join after them, through a rendezvous of its
//! own, so a job that shrank past a dead rank can take a spare back in.

use super::*;

impl Communicator {
    /// The id new ranks join a grown communicator with. Every rank of this communicator calls
    /// it and gets the same id: rank 0 makes it, starting a rendezvous root in its process
    /// that serves one grown communicator until it is built or `STRATA_INIT_TIMEOUT` passes.
    /// Hand it to the new ranks by any means (its 128 bytes, or [`UniqueId::to_hex`]).
    pub fn grow_id(&self) -> Result<UniqueId> {
        let mut bytes = [0u8; bootstrap::UNIQUE_ID_BYTES];
        if self.rank() == 0 {
            let cfg = &self.inner.cfg;
            let secret = crate::wire::random_bytes()?;
            let id = UniqueId::serve(SocketAddr::new(cfg.listen_ip, 0), secret, cfg.init_timeout);
            match id {
                Ok(id) => bytes = *id.as_bytes(),
                // The others still wait for the broadcast: send them zeros, which no id is,
                // so every rank fails with an error instead of waiting.
                Err(e) => {
                    self.broadcast_in_place(&mut bytes, 0)?;
                    return Err(e);
                }
            }
        }
        self.broadcast_in_place(&mut bytes, 0)?;
        if bytes.iter().all(|&b| b == 0) {
            return Err(Error::Transport(
                "grow: rank 0 could not start the rendezvous of the grown communicator".into(),
            ));
        }
        UniqueId::from_bytes(&bytes)
    }

    /// A communicator of `new_size` ranks: this one's, keeping their numbers, then new ranks
    /// numbered from this one's size, which join with
    /// [`Communicator::init`]`(id, new_size, rank)`. Every rank of this communicator calls it
    /// with the id [`Communicator::grow_id`] gave. This communicator stays usable; the grown
    /// one keeps its explicit algorithm choices. Fails after `STRATA_INIT_TIMEOUT` if a rank
    /// never comes.
    pub fn grow(&self, id: &UniqueId, new_size: usize) -> Result<Communicator> {
        if new_size < self.size() {
            return Err(Error::InvalidArgument(format!(
                "grow: {new_size} ranks is fewer than this communicator's {}",
                self.size()
            )));
        }
        let child = Self::init_with_config(id, new_size, self.rank(), self.inner.cfg.clone())?;
        for (mine, theirs) in child.inner.algo_choice.iter().zip(&self.inner.algo_choice) {
            mine.store(theirs.load(Ordering::Relaxed), Ordering::Relaxed);
        }
        Ok(child)
    }
}
