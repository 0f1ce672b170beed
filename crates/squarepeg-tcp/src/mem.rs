//! The endpoint-wide memory budget (Linux `tcp_mem`, with `tcp_rmem[0]`/`tcp_wmem[0]` as the
//! per-connection floors).
//!
//! # What is counted
//!
//! Payload bytes every connection holds: its send queue (unsent plus unacknowledged, SACKed
//! bytes included: RFC 2018 §8 lets the receiver renege, so they stay until cumulatively
//! acknowledged), in-order received bytes the application has not read, out-of-order bytes,
//! and in uTCP mode the bytes of segments queued for the application
//! ([`crate::utcp`]; there the receive buffer keeps only counts). Bookkeeping (record headers,
//! range maps, allocator slack) is not counted: it is bounded per byte or per range by the
//! per-connection limits.
//!
//! # The bound
//!
//! Each connection holds `send` and `recv` bytes. A connection may always grow a direction up
//! to the floor ([`MemoryBudget::per_connection_floor`]), whatever the others hold, so that a
//! new connection is served however many stalled ones exist (Linux guarantees `tcp_rmem[0]`
//! and `tcp_wmem[0]` under pressure the same way). Above its floor a direction grows only
//! while the endpoint's total stays within [`MemoryBudget::limit`]. Growth is admitted byte
//! exactly (writes are shortened, received segments trimmed), so at every moment
//!
//! ```text
//! in_use <= limit + Σ over connections (min(send, floor) + min(recv, floor))
//!        <= limit + 2 × floor × connections
//! ```
//!
//! (`Endpoint::check_invariants` checks the first form). Proof sketch: growth admitted by the
//! floor rule raises both sides by the same amount; growth admitted by the limit rule keeps
//! `in_use <= limit`; shrinking lowers the left side at least as much as the right.
//!
//! # Policy
//!
//! - Below [`MemoryBudget::pressure`] windows and writes follow the per-connection buffers
//!   ([`crate::ConnectionConfig::recv_buffer`], [`crate::ConnectionConfig::send_buffer`]).
//! - Above it (Linux's memory pressure) a receive window opens no further than the floor, or
//!   an equal share of what is left under the limit. The right edge already advertised is
//!   never moved left (RFC 9293 §3.8.6, RFC 7323 §2.4), so data inside an older window may
//!   still arrive.
//! - Whatever arrives beyond what may be admitted is dropped, the segment trimmed to what
//!   fits, and acknowledged at once; the sender retransmits (RFC 9293 §3.10.7.4 allows a
//!   receiver to drop acceptable segments it cannot buffer). In-order data comes first: when
//!   it does not fit, the connection's own out-of-order ranges are dropped from the highest
//!   down to make room, as Linux's `tcp_prune_ofo_queue` does (reneging on SACKed data, which
//!   RFC 2018 §8 permits). In uTCP mode copies of already-received bytes are not queued.
//! - Receiver silly-window avoidance (RFC 9293 §3.8.6.2.2) takes the buffer the budget allows
//!   as RCV.BUFF, so that a floor smaller than two segments still opens the window.
//! - Writes accept only what may be admitted: a short count, or `WouldBlock` (and a
//!   `Writable` event once there is room), as with a full send buffer.
//!
//! Nothing above is permanent: as soon as the application reads, the peer acknowledges, or
//! connections close, the room comes back and windows reopen (the peer's window probes, RFC
//! 9293 §3.8.6.1, fetch the reopened window from a connection that advertised zero).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};

/// The endpoint-wide memory budget ([`crate::EndpointConfig::memory`]); see [`crate::mem`]
/// for what is counted, the exact bound and the policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct MemoryBudget {
    /// Hard limit in bytes (Linux `tcp_mem[2]`): above each connection's floors nothing is
    /// admitted beyond it. Default 64 MiB.
    pub limit: usize,
    /// Pressure threshold in bytes (Linux `tcp_mem[1]`): above it receive windows stop
    /// opening beyond the floor or a fair share of what is left. Default 48 MiB.
    pub pressure: usize,
    /// Bytes each connection may hold in each direction whatever the others hold (Linux
    /// `tcp_rmem[0]`, `tcp_wmem[0]`). Default 16 KiB (about 11 segments at MTU 1500).
    pub per_connection_floor: usize,
}

impl MemoryBudget {
    /// A budget of `limit` bytes, pressure at three quarters of it, and the default floor.
    pub fn new(limit: usize) -> Self {
        MemoryBudget {
            limit,
            pressure: limit / 4 * 3,
            per_connection_floor: 16 << 10,
        }
    }

    /// No limit: every connection bounded by its own buffers only.
    pub fn unlimited() -> Self {
        MemoryBudget {
            limit: usize::MAX,
            pressure: usize::MAX,
            per_connection_floor: 16 << 10,
        }
    }

    /// The same budget with another pressure threshold.
    pub fn with_pressure(mut self, pressure: usize) -> Self {
        self.pressure = pressure;
        self
    }

    /// The same budget with another per-connection floor.
    pub fn with_floor(mut self, floor: usize) -> Self {
        self.per_connection_floor = floor;
        self
    }
}

impl Default for MemoryBudget {
    fn default() -> Self {
        MemoryBudget::new(64 << 20)
    }
}

#[derive(Debug, Default)]
struct Counters {
    in_use: AtomicUsize,
    peak: AtomicUsize,
    connections: AtomicUsize,
    drops: AtomicU64,
    limited_writes: AtomicU64,
    pressure_events: AtomicU64,
}

/// The endpoint's account, shared by its connections (one thread uses it at a time; atomics
/// only keep the endpoint `Send` and `Sync`).
#[derive(Clone, Debug)]
pub(crate) struct MemPool {
    budget: MemoryBudget,
    c: Arc<Counters>,
}

/// Counters of the memory budget, as [`crate::EndpointStats`] shows them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct MemSnapshot {
    pub in_use: usize,
    pub peak: usize,
    pub drops: u64,
    pub limited_writes: u64,
    pub pressure_events: u64,
}

impl MemPool {
    pub(crate) fn new(budget: MemoryBudget) -> Self {
        MemPool {
            budget,
            c: Arc::default(),
        }
    }

    pub(crate) fn budget(&self) -> MemoryBudget {
        self.budget
    }

    pub(crate) fn snapshot(&self) -> MemSnapshot {
        MemSnapshot {
            in_use: self.c.in_use.load(Relaxed),
            peak: self.c.peak.load(Relaxed),
            drops: self.c.drops.load(Relaxed),
            limited_writes: self.c.limited_writes.load(Relaxed),
            pressure_events: self.c.pressure_events.load(Relaxed),
        }
    }
}

/// A connection's share of the account: what it has charged to the pool so far. The charge
/// is brought up to date after every operation on the connection
/// ([`sync`](Self::sync)); in between, the connection's own growth is seen through
/// [`total`](Self::total). Dropping it returns the charge.
#[derive(Debug)]
pub(crate) struct ConnMem {
    pool: MemPool,
    charged: usize,
}

impl ConnMem {
    pub(crate) fn new(pool: MemPool) -> Self {
        pool.c.connections.fetch_add(1, Relaxed);
        ConnMem { pool, charged: 0 }
    }

    pub(crate) fn floor(&self) -> usize {
        self.pool.budget.per_connection_floor
    }

    pub(crate) fn charged(&self) -> usize {
        self.charged
    }

    /// The endpoint's total now, given what this connection holds now.
    pub(crate) fn total(&self, held: usize) -> usize {
        (self.pool.c.in_use.load(Relaxed) - self.charged).saturating_add(held)
    }

    /// Bytes one direction holding `dir` may still grow by, the connection holding `held`:
    /// up to the floor, or up to the limit.
    pub(crate) fn room(&self, dir: usize, held: usize) -> usize {
        let floor_room = self.floor().saturating_sub(dir);
        let limit_room = self.pool.budget.limit.saturating_sub(self.total(held));
        floor_room.max(limit_room)
    }

    /// Most the receive window may offer beyond what is held: unbounded below the pressure
    /// threshold; above it the floor or an equal share of what is left under the limit.
    pub(crate) fn window_room(&self, dir: usize, held: usize) -> usize {
        let total = self.total(held);
        if total <= self.pool.budget.pressure {
            return usize::MAX;
        }
        let conns = self.pool.c.connections.load(Relaxed).max(1);
        let share = self.pool.budget.limit.saturating_sub(total) / conns;
        self.floor().saturating_sub(dir).max(share)
    }

    pub(crate) fn note_drop(&self) {
        self.pool.c.drops.fetch_add(1, Relaxed);
    }

    pub(crate) fn note_limited_write(&self) {
        self.pool.c.limited_writes.fetch_add(1, Relaxed);
    }

    /// Brings the charge to `held`.
    pub(crate) fn sync(&mut self, held: usize) {
        let c = &self.pool.c;
        let before = c.in_use.load(Relaxed);
        let after = before - self.charged + held;
        c.in_use.store(after, Relaxed);
        self.charged = held;
        if after > c.peak.load(Relaxed) {
            c.peak.store(after, Relaxed);
        }
        let p = self.pool.budget.pressure;
        if before <= p && after > p {
            c.pressure_events.fetch_add(1, Relaxed);
        }
    }
}

impl Drop for ConnMem {
    fn drop(&mut self) {
        self.pool.c.in_use.fetch_sub(self.charged, Relaxed);
        self.pool.c.connections.fetch_sub(1, Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charges_follow_sync_and_drop() {
        let pool = MemPool::new(MemoryBudget::new(100).with_floor(10).with_pressure(80));
        let mut a = ConnMem::new(pool.clone());
        let mut b = ConnMem::new(pool.clone());
        a.sync(60);
        b.sync(30);
        assert_eq!(pool.snapshot().in_use, 90);
        assert_eq!(pool.snapshot().pressure_events, 1);
        // Unsynced growth of `a` is seen through its own view.
        assert_eq!(a.total(70), 100);
        // a: 60 held in one direction, 10 left under the limit.
        assert_eq!(a.room(60, 60), 10);
        // b at 30 (above its floor of 10): 10 left under the limit.
        assert_eq!(b.room(30, 30), 10);
        // A direction below its floor always has the floor.
        assert_eq!(b.room(0, 30), 10);
        b.sync(40);
        assert_eq!(pool.snapshot().in_use, 100);
        assert_eq!(a.room(60, 60), 0);
        assert_eq!(a.room(5, 60), 5);
        // Above pressure: windows get the floor or an equal share of what is left.
        assert_eq!(a.window_room(0, 60), 10);
        b.sync(0);
        assert_eq!(pool.snapshot().in_use, 60);
        assert_eq!(a.window_room(60, 60), usize::MAX);
        assert_eq!(pool.snapshot().peak, 100);
        drop(a);
        assert_eq!(pool.snapshot().in_use, 0);
        b.sync(95);
        // One connection left: all that remains is its share.
        assert_eq!(b.window_room(95, 95), 5);
        drop(b);
        assert_eq!(
            pool.snapshot(),
            MemSnapshot {
                in_use: 0,
                peak: 100,
                drops: 0,
                limited_writes: 0,
                pressure_events: 2
            }
        );
    }
}
