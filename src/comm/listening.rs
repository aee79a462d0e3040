//! A communicator's listener with the services its modules serve through it: bootstrap tree
//! edges, watchdog links and status, census questions, the live view and shrinks. Each module supplies its
//! handler; this is the one place they are put together.

use super::shrink::Shrinks;
use crate::bootstrap::TreeInbox;
use crate::config::Config;
use crate::connection::{CommListener, Connection, Routes};
use crate::diagnosis::{self, Diagnoser, DiagnoserCell};
use crate::error::Result;
use crate::status::{self, StatusCell, StatusSource};
use crate::watchdog::{self, Health, LinkInbox};
use crate::wire::{PeerInfo, Route, Secret};
use std::net::TcpListener;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A started listener and the state its handlers share with the communicator.
pub(super) struct Listening {
    conns: CommListener,
    health: Arc<Health>,
    tree_in: Arc<TreeInbox>,
    watchdog_in: LinkInbox,
    diagnoser: DiagnoserCell,
    status: StatusCell,
    shrinks: Arc<Shrinks>,
}

impl Listening {
    /// Starts serving `listener` for rank `rank` of `nranks` of communicator `comm`.
    pub fn start(
        listener: TcpListener,
        comm: String,
        rank: usize,
        nranks: usize,
        secret: Secret,
        cfg: &Config,
    ) -> Result<Self> {
        Self::with_routes(rank, nranks, cfg, |routes| {
            CommListener::start(listener, comm, rank, nranks, secret, cfg, routes)
        })
    }

    /// Serves rank `rank` of `nranks` of communicator `comm` through this listener's socket,
    /// with services of its own: a communicator made from this one's table.
    pub fn attach(&self, comm: String, rank: usize, nranks: usize, cfg: &Config) -> Result<Self> {
        Self::with_routes(rank, nranks, cfg, |routes| {
            self.conns.attach(comm, rank, nranks, cfg, routes)
        })
    }

    /// The services of one communicator, served by the listener `listen` makes of them.
    fn with_routes(
        rank: usize,
        nranks: usize,
        cfg: &Config,
        listen: impl FnOnce(Routes) -> Result<CommListener>,
    ) -> Result<Self> {
        let health = Arc::new(Health::default());
        let tree_in = Arc::new(TreeInbox::default());
        let watchdog_in = LinkInbox::default();
        let diagnoser = DiagnoserCell::default();
        let status = StatusCell::default();
        let shrinks = Shrinks::new(cfg.init_timeout);
        let mut routes = Routes::default();
        routes
            .add(Route::Tree, tree_in.handler(rank, nranks))
            .add(
                Route::Watchdog,
                watchdog::link_handler(rank, nranks, watchdog_in.clone()),
            )
            .add(Route::Status, watchdog::status_handler(health.clone()))
            .add(
                Route::Census,
                diagnosis::census_handler(diagnoser.clone(), health.clone()),
            )
            .add(Route::JobStatus, status::status_handler(status.clone()))
            .add(Route::Shrink, shrinks.handler());
        Ok(Self {
            conns: listen(routes)?,
            health,
            tree_in,
            watchdog_in,
            diagnoser,
            status,
            shrinks,
        })
    }

    /// Takes the connection from `peer` if its listener side is complete.
    pub fn take(&self, peer: usize) -> Option<Connection> {
        self.conns.take(peer)
    }

    /// Every accepted connection no call has taken yet.
    pub fn take_all(&self) -> Vec<Connection> {
        self.conns.take_all()
    }

    /// Waits up to `d` for a new connection, unless one from `peers` is already there to take.
    pub fn wait_for_any(&self, peers: &[usize], d: Duration) {
        self.conns.wait_for_any(peers, d)
    }

    /// The communicator id this listener serves.
    pub fn comm(&self) -> &str {
        self.conns.comm()
    }

    /// The communicator's health (abort flags, fault, progress), shared with the handlers.
    pub fn health(&self) -> Arc<Health> {
        self.health.clone()
    }

    /// Where the bootstrap tree edges opened to this rank are handed over.
    pub fn tree_inbox(&self) -> Arc<TreeInbox> {
        self.tree_in.clone()
    }

    /// Where the watchdog links from the ranks 2^k behind are handed over.
    pub fn watchdog_inbox(&self) -> LinkInbox {
        self.watchdog_in.clone()
    }

    /// Lets the listener answer census questions with the communicator's diagnoser.
    pub fn set_diagnoser(&self, diagnoser: Arc<Diagnoser>) {
        let _ = self.diagnoser.set(diagnoser);
    }

    /// Lets the listener answer status questions with the communicator's source.
    pub fn set_status_source(&self, source: Arc<StatusSource>) {
        let _ = self.status.set(source);
    }

    /// Joins shrink `key` as its lowest survivor (see [`Shrinks::join`]).
    pub fn shrink_join(
        &self,
        key: &str,
        expected: usize,
        info: PeerInfo,
        deadline: Instant,
    ) -> Result<Vec<PeerInfo>> {
        self.shrinks.join(key, expected, info, deadline)
    }
}
