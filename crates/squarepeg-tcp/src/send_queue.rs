//! The send queue: an ordered list of *writes* (records), each with a tag.
//!
//! Minion §4.2 and Hollywood §4.2 need a send queue that knows the application's write
//! boundaries: writes whose first byte has been transmitted are *committed* (their stream
//! offsets are fixed, and nothing may be inserted ahead of or inside them); writes not yet
//! touched are *pending* and may still be reordered by priority, squashed, or dropped when
//! their deadline passes. Standard TCP behaviour is plain appends with MSS-packing across
//! writes.
//!
//! Two kinds of writes:
//! - **bytes** ([`SendQueue::push`], the standard `write`): accepted partially when the buffer
//!   is nearly full, and small ones merged into one record (without consistent segmentation);
//! - **messages** ([`SendQueue::insert_message`]): whole, self-delimiting units (uCOBS frames)
//!   accepted all or nothing, inserted by priority (Minion §4.2), squashed by key, dropped
//!   before their first transmission when their deadline passes (Hollywood §4.2), and never
//!   packed into a segment together with other writes (consistent segmentation). A message
//!   with a deadline whose retransmission would arrive too late may be replaced, whole, by
//!   live messages padded to exactly its length (Hollywood §4.2 inconsistent
//!   retransmissions, [`SendQueue::replace_expired_with`]): pending messages, which then leave
//!   the pending queue, or copies of live messages in flight (Hollywood considers every
//!   complete message in the send queue). A message carried twice reports its fate once:
//!   acknowledged when either copy is, replaced only when no copy is left.
//!
//! ## Liveness and dependencies
//!
//! A message is *kept* until the latest of its own deadline and the keep times of the
//! messages that depend on it (Hollywood §4.2: a message is always retransmitted while an
//! unexpired message depends on it). Dependents count whether they are still queued,
//! committed or already acknowledged (the receiver needs what they build on) until they are
//! dropped unsent. A message without a deadline is kept forever, and so is everything it
//! depends on. Dependency chains are followed [`MAX_DEPENDENCY_DEPTH`] levels deep; a deeper
//! chain keeps the message (the safe answer is the standard TCP behaviour). A message that
//! arrives after the message it depends on was dropped unsent (expired or squashed) is
//! useless to the receiver and expires at once (Hollywood §7.2); the queue remembers the
//! last [`MAX_REMEMBERED_DROPS`] dropped ids for this (beyond them, the message is sent).
//!
//! ## Reports
//!
//! Writes with a message id produce [`MessageReport`]s, so that the layer above can keep its
//! message statuses true: sent (first transmission, also as a replacement), acknowledged
//! (messages with a deadline), expired, squashed, replaced.
//!
//! Offsets here are stream offsets: 0 is the first data byte after the SYN.

use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
use std::time::{Duration, Instant};

use crate::error::Error;

/// Per-write metadata. None of it goes on the wire; later layers use it to reorder, squash and
/// replace writes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WriteTag {
    /// Higher values are more urgent (Minion §4.2 priority tags). 0 is the default.
    pub priority: i32,
    /// Writes with the same key supersede each other while untransmitted (Minion §4.2 squash).
    pub squash_key: Option<u64>,
    /// Message deadline (Hollywood §4.2 lifetime): the time by which it must have arrived.
    pub deadline: Option<Instant>,
    /// Message this one depends on, by message id (Hollywood §4.2).
    pub depends_on: Option<u64>,
    /// Message identifier of the upper layer; messages with one produce [`MessageReport`]s
    /// and can be depended on.
    pub message_id: Option<u64>,
}

impl WriteTag {
    fn is_plain(&self) -> bool {
        *self == WriteTag::default()
    }
}

/// What became of a message (a write with a message id) in the send queue. Each message gets
/// at most one of `Expired`, `Squashed` (never transmitted) or `Sent`; after `Sent`, a message
/// with a deadline gets `Acked` or `Replaced`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MessageReport {
    /// Its first byte was transmitted. `replacement`: it went out in the sequence range of
    /// expired messages, in a retransmission (Hollywood §4.2).
    Sent { id: u64, replacement: bool },
    /// Cumulatively acknowledged (reported for messages with a deadline only: the others are
    /// settled once sent).
    Acked { id: u64 },
    /// Dropped before its first transmission: its deadline passed and nothing that depends on
    /// it was still live, or the message it depends on had been dropped unsent.
    Expired { id: u64 },
    /// Dropped before its first transmission by a newer write with the same squash key.
    Squashed { id: u64 },
    /// Transmitted, but a retransmission of its range carried other messages instead: it
    /// arrives only if its first transmission did.
    Replaced { id: u64 },
}

impl MessageReport {
    /// The message id reported on.
    pub fn id(&self) -> u64 {
        match *self {
            MessageReport::Sent { id, .. }
            | MessageReport::Acked { id }
            | MessageReport::Expired { id }
            | MessageReport::Squashed { id }
            | MessageReport::Replaced { id } => id,
        }
    }
}

/// Plain writes are merged into one record up to this size, so that many small writes do not
/// cost one allocation each.
const MERGE_LIMIT: usize = 64 * 1024;

/// How many levels of dependents are followed to find how long a message is kept.
pub const MAX_DEPENDENCY_DEPTH: u32 = 32;

/// How many ids of messages dropped unsent are remembered, so that a message depending on one
/// of them expires at once.
pub const MAX_REMEMBERED_DROPS: usize = 4096;

/// Reports held for the upper layer; beyond this the oldest are dropped and counted (an upper
/// layer that asks for reports drains them after every call).
pub const MAX_PENDING_REPORTS: usize = 1 << 16;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// Plain stream bytes.
    Bytes,
    /// A whole message.
    Message,
    /// Filler written by an inconsistent retransmission.
    Padding,
}

#[derive(Debug)]
struct Record {
    /// Stream offset of `data[0]`; meaningful once committed.
    start: u64,
    data: Vec<u8>,
    tag: WriteTag,
    kind: Kind,
    serial: u64,
    /// A lifetime not yet turned into a deadline (writes through the record API, which carry
    /// no clock reading: the deadline counts from the next time the connection sees the time).
    lifetime: Option<Duration>,
    /// Committed: part of it is known to have reached the receiver (SACKed, or partly
    /// acknowledged), so it may not be replaced (Hollywood §4.2).
    received: bool,
}

impl Record {
    fn end(&self) -> u64 {
        self.start + self.data.len() as u64
    }

    fn deadline(&self) -> Deadline {
        match (self.lifetime, self.tag.deadline) {
            (Some(_), _) => Deadline::Unresolved,
            (None, Some(t)) => Deadline::At(t),
            (None, None) => Deadline::Never,
        }
    }
}

/// Why a pending write left the queue unsent.
#[derive(Clone, Copy, Debug)]
enum Dropped {
    Expired,
    Squashed,
}

/// A message's own deadline.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Deadline {
    At(Instant),
    Never,
    /// Counts as `Never` until resolved.
    Unresolved,
}

/// A message that depends on another.
#[derive(Clone, Copy, Debug)]
struct Dependent {
    serial: u64,
    id: Option<u64>,
    deadline: Deadline,
}

/// A committed write as seen by the upper layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CommittedWrite {
    pub start: u64,
    pub len: usize,
    pub tag: WriteTag,
}

/// Counters of the send queue's message handling.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SendQueueStats {
    /// Messages dropped unsent because their deadline passed.
    pub messages_expired: u64,
    /// Messages dropped unsent by a newer one with the same squash key.
    pub messages_squashed: u64,
    /// Messages whose retransmission carried other messages instead.
    pub messages_replaced: u64,
    /// Messages first sent as replacements.
    pub replacement_messages: u64,
    /// Second copies of live messages already in flight sent as replacements (Hollywood
    /// §4.2 counts every complete message in the send queue as a candidate).
    pub replacement_copies: u64,
    /// Sequence ranges (runs of expired messages) filled with replacements.
    pub replaced_ranges: u64,
    /// Bytes of padding written into replaced ranges.
    pub padding_bytes: u64,
    /// Reports dropped because the upper layer did not take them.
    pub reports_dropped: u64,
}

/// Where a replacement candidate is: a pending write moves into the replaced range, an
/// in-flight (committed) one is copied there. Pending sorts first among equal deadlines: it
/// has not been sent at all.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Source {
    Pending(usize),
    InFlight(usize),
}

/// What one call of [`SendQueue::replace_expired_with`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Replacement {
    pub ranges: u64,
    pub replaced: u64,
    pub replacements: u64,
}

/// What fills a replaced range (Hollywood §4.2): it writes the padding after the
/// replacements, exactly `len` bytes that the receiver's upper layer discards, and sees every
/// range replaced. The TCP core stays framing-agnostic; setting a padder enables inconsistent
/// retransmissions. Implementations share state with the layer above (a TLS padder seals
/// records under the connection's keys), hence `&self`.
pub trait Pad: Send + Sync {
    /// The shortest padding it can write (a TLS record has a header, a tag and a number):
    /// the queue leaves either no padding or at least this much.
    fn min_len(&self) -> usize {
        0
    }

    /// Called once for each sequence range about to be replaced, `range` in stream offsets:
    /// appends exactly `len` bytes of padding (0 when the replacements fill the range) that
    /// go at the range's end. Returns false to decline: the range is retransmitted as it was.
    fn pad(&self, range: std::ops::Range<u64>, len: usize, out: &mut Vec<u8>) -> bool;
}

/// Padding written by a plain function of the length (for squarepeg in cleartext,
/// [`squarepeg_framing::encode_padding`]).
///
/// [`squarepeg_framing::encode_padding`]: https://docs.rs/squarepeg-framing
struct FnPad(fn(usize, &mut Vec<u8>));

impl Pad for FnPad {
    fn pad(&self, _range: std::ops::Range<u64>, len: usize, out: &mut Vec<u8>) -> bool {
        if len > 0 {
            (self.0)(len, out);
        }
        true
    }
}

/// The padder of a connection: see [`Pad`].
#[derive(Clone)]
pub struct Padder(std::sync::Arc<dyn Pad>);

impl Padder {
    /// A padder writing `len` bytes with `write(len, out)`.
    pub fn from_fn(write: fn(usize, &mut Vec<u8>)) -> Self {
        Padder(std::sync::Arc::new(FnPad(write)))
    }

    /// A padder with state of its own.
    pub fn new(pad: std::sync::Arc<dyn Pad>) -> Self {
        Padder(pad)
    }

    fn min_len(&self) -> usize {
        self.0.min_len()
    }

    fn pad(&self, range: std::ops::Range<u64>, len: usize, out: &mut Vec<u8>) -> bool {
        self.0.pad(range, len, out)
    }
}

impl std::fmt::Debug for Padder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Padder(..)")
    }
}

impl PartialEq for Padder {
    fn eq(&self, other: &Self) -> bool {
        std::sync::Arc::ptr_eq(&self.0, &other.0)
    }
}

/// The send queue of one connection. The upper layer reaches it through
/// [`Endpoint::send_queue`](crate::Endpoint::send_queue) to inspect writes and squash pending
/// ones; appends and transmission bookkeeping stay with the connection.
#[derive(Debug)]
pub struct SendQueue {
    committed: VecDeque<Record>,
    pending: VecDeque<Record>,
    /// First unacknowledged stream offset.
    una: u64,
    /// Offset just after the last committed byte (= start of the first pending write).
    committed_end: u64,
    pending_bytes: usize,
    limit: usize,
    merge_plain: bool,
    next_serial: u64,
    /// Pending messages by the time to check whether they expired (their deadline, or the
    /// time their dependents keep them until). Entries may be stale: checked when due.
    expiry: BTreeSet<(Instant, u64)>,
    /// Records whose lifetime awaits a clock reading.
    unresolved: usize,
    /// Message ids in the queue (pending or committed), with how many records carry each
    /// (more than one once a replacement has copied an in-flight message).
    ids: HashMap<u64, u32>,
    /// Ids of messages with copies in the queue whose fate is already reported (one copy
    /// was acknowledged): the other copies report nothing more.
    settled: HashSet<u64>,
    /// Dependents by the id of the message they depend on; kept while that message is queued.
    dependents: HashMap<u64, Vec<Dependent>>,
    /// Ids of the last [`MAX_REMEMBERED_DROPS`] messages dropped unsent, oldest first.
    dropped: VecDeque<u64>,
    dropped_ids: HashSet<u64>,
    reports: VecDeque<MessageReport>,
    stats: SendQueueStats,
}

impl SendQueue {
    pub(crate) fn new(limit: usize, merge_plain: bool) -> Self {
        SendQueue {
            committed: VecDeque::new(),
            pending: VecDeque::new(),
            una: 0,
            committed_end: 0,
            pending_bytes: 0,
            limit,
            merge_plain,
            next_serial: 0,
            expiry: BTreeSet::new(),
            unresolved: 0,
            ids: HashMap::new(),
            settled: HashSet::new(),
            dependents: HashMap::new(),
            dropped: VecDeque::new(),
            dropped_ids: HashSet::new(),
            reports: VecDeque::new(),
            stats: SendQueueStats::default(),
        }
    }

    /// Bytes held (unacknowledged plus unsent).
    pub fn len(&self) -> usize {
        (self.committed_end - self.una) as usize + self.pending_bytes
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Free space under the limit.
    pub fn free(&self) -> usize {
        self.limit.saturating_sub(self.len())
    }

    /// Stream offset just after the last byte queued.
    pub fn end(&self) -> u64 {
        self.committed_end + self.pending_bytes as u64
    }

    /// First unacknowledged offset.
    pub fn una(&self) -> u64 {
        self.una
    }

    /// Offset just after the last committed byte.
    pub fn committed_end(&self) -> u64 {
        self.committed_end
    }

    /// Counters.
    pub fn stats(&self) -> SendQueueStats {
        self.stats
    }

    /// The next report, if any.
    pub fn poll_report(&mut self) -> Option<MessageReport> {
        self.reports.pop_front()
    }

    /// Reports waiting.
    pub fn pending_reports(&self) -> usize {
        self.reports.len()
    }

    fn report(&mut self, report: MessageReport) {
        if self.reports.len() >= MAX_PENDING_REPORTS {
            self.reports.pop_front();
            self.stats.reports_dropped += 1;
        }
        self.reports.push_back(report);
    }

    fn serial(&mut self) -> u64 {
        self.next_serial += 1;
        self.next_serial
    }

    /// Appends as much of `data` as fits (standard TCP `send`). Returns the bytes accepted.
    pub(crate) fn push(&mut self, data: &[u8], tag: WriteTag) -> usize {
        let n = data.len().min(self.free());
        if n == 0 {
            return 0;
        }
        let data = &data[..n];
        if self.merge_plain
            && tag.is_plain()
            && let Some(last) = self.pending.back_mut()
            && last.kind == Kind::Bytes
            && last.tag.is_plain()
            && last.data.len() + n <= MERGE_LIMIT
        {
            last.data.extend_from_slice(data);
        } else {
            let serial = self.serial();
            self.pending.push_back(Record {
                start: 0,
                data: data.to_vec(),
                tag,
                kind: Kind::Bytes,
                serial,
                lifetime: None,
                received: false,
            });
        }
        self.pending_bytes += n;
        n
    }

    /// Queues a whole message (all or nothing): ahead of every pending write of lower
    /// priority, never ahead of or inside a committed write (Minion §4.2); first dropping the
    /// pending messages with the same squash key that nothing live depends on (Minion §4.2
    /// squash). `lifetime`, if given, replaces `tag.deadline` by a deadline counted from the
    /// next [`resolve`](Self::resolve). `now` is the latest time the connection knows.
    pub(crate) fn insert_message(
        &mut self,
        now: Instant,
        data: &[u8],
        tag: WriteTag,
        lifetime: Option<Duration>,
    ) -> Result<(), Error> {
        if data.is_empty() {
            return Err(Error::EmptyMessage);
        }
        // Hollywood §7.2: a message whose dependency was dropped unsent has expired (before
        // it could squash anything).
        if let Some(target) = tag.depends_on
            && self.dropped_ids.contains(&target)
        {
            self.stats.messages_expired += 1;
            if let Some(id) = tag.message_id {
                self.remember_dropped(id);
                self.report(MessageReport::Expired { id });
            }
            return Ok(());
        }
        // An id used again (the layer above chooses them) is no longer a dropped one.
        if let Some(id) = tag.message_id {
            self.dropped_ids.remove(&id);
        }
        let squashable: Vec<usize> = match tag.squash_key {
            Some(key) => (0..self.pending.len())
                .filter(|&i| {
                    let r = &self.pending[i];
                    r.kind == Kind::Message
                        && r.tag.squash_key == Some(key)
                        && !self.has_live_dependents(r.tag.message_id, now)
                })
                .collect(),
            None => Vec::new(),
        };
        let freed: usize = squashable.iter().map(|&i| self.pending[i].data.len()).sum();
        if data.len() > self.free() + freed {
            return Err(Error::WouldBlock);
        }
        for &i in squashable.iter().rev() {
            if let Some(r) = self.pending.remove(i) {
                self.pending_bytes -= r.data.len();
                self.stats.messages_squashed += 1;
                self.drop_unsent(r, Dropped::Squashed);
            }
        }
        let serial = self.serial();
        let record = Record {
            start: 0,
            data: data.to_vec(),
            tag: WriteTag {
                deadline: if lifetime.is_some() {
                    None
                } else {
                    tag.deadline
                },
                ..tag
            },
            kind: Kind::Message,
            serial,
            lifetime,
            received: false,
        };
        if record.lifetime.is_some() {
            self.unresolved += 1;
        }
        if let Deadline::At(t) = record.deadline() {
            self.expiry.insert((t, serial));
        }
        if let Some(id) = record.tag.message_id {
            *self.ids.entry(id).or_insert(0) += 1;
        }
        if let Some(target) = record.tag.depends_on
            && self.ids.contains_key(&target)
        {
            self.dependents.entry(target).or_default().push(Dependent {
                serial,
                id: record.tag.message_id,
                deadline: record.deadline(),
            });
        }
        let at = self
            .pending
            .iter()
            .position(|r| r.tag.priority < tag.priority)
            .unwrap_or(self.pending.len());
        self.pending_bytes += record.data.len();
        self.pending.insert(at, record);
        Ok(())
    }

    /// Gives every pending lifetime its deadline: `now` plus the lifetime.
    pub(crate) fn resolve(&mut self, now: Instant) {
        if self.unresolved == 0 {
            return;
        }
        let mut resolved: Vec<(u64, Instant)> = Vec::new();
        for r in self.pending.iter_mut().chain(self.committed.iter_mut()) {
            if let Some(l) = r.lifetime.take() {
                let t = now.checked_add(l).unwrap_or(now);
                r.tag.deadline = Some(t);
                resolved.push((r.serial, t));
            }
        }
        self.unresolved = 0;
        for &(serial, t) in &resolved {
            self.expiry.insert((t, serial));
        }
        for deps in self.dependents.values_mut() {
            for d in deps.iter_mut() {
                if d.deadline == Deadline::Unresolved
                    && let Some(&(_, t)) = resolved.iter().find(|(s, _)| *s == d.serial)
                {
                    d.deadline = Deadline::At(t);
                }
            }
        }
    }

    /// Until when a message with this deadline and id is kept: its deadline, or later while
    /// messages depending on it are kept. `None`: forever.
    fn keep_until(&self, deadline: Deadline, id: Option<u64>, depth: u32) -> Option<Instant> {
        let Deadline::At(own) = deadline else {
            return None;
        };
        let mut until = own;
        if let Some(deps) = id.and_then(|id| self.dependents.get(&id)) {
            if depth >= MAX_DEPENDENCY_DEPTH {
                return None;
            }
            for d in deps {
                until = until.max(self.keep_until(d.deadline, d.id, depth + 1)?);
            }
        }
        Some(until)
    }

    /// Whether a message that depends on message `id` is kept beyond `now`.
    fn has_live_dependents(&self, id: Option<u64>, now: Instant) -> bool {
        let Some(deps) = id.and_then(|id| self.dependents.get(&id)) else {
            return false;
        };
        deps.iter()
            .any(|d| self.keep_until(d.deadline, d.id, 1).is_none_or(|t| t > now))
    }

    /// How many records in the queue carry message `id`.
    fn copies_of(&self, id: u64) -> u32 {
        self.ids.get(&id).copied().unwrap_or(0)
    }

    /// Forgets a record that leaves the queue: its id, its dependency entries, and (for
    /// messages dropped unsent) its place among the dependents of the message it depended on.
    fn forget(&mut self, r: &Record, dead: bool) {
        if let Some(id) = r.tag.message_id
            && let Some(n) = self.ids.get_mut(&id)
        {
            *n -= 1;
            if *n == 0 {
                self.ids.remove(&id);
                self.settled.remove(&id);
                self.dependents.remove(&id);
            }
        }
        if r.lifetime.is_some() {
            self.unresolved -= 1;
        }
        if dead
            && let Some(target) = r.tag.depends_on
            && let Some(deps) = self.dependents.get_mut(&target)
        {
            deps.retain(|d| d.serial != r.serial);
            // The target may expire sooner now: check it at its own deadline.
            if let Some(t) = self
                .pending
                .iter()
                .find(|p| p.tag.message_id == Some(target))
                .and_then(|p| p.tag.deadline)
            {
                self.expiry.insert((t, 0));
            }
        }
    }

    /// Remembers a message dropped unsent, for the messages that may still come to depend
    /// on it.
    fn remember_dropped(&mut self, id: u64) {
        if self.dropped_ids.insert(id) {
            if self.dropped.len() >= MAX_REMEMBERED_DROPS
                && let Some(old) = self.dropped.pop_front()
            {
                self.dropped_ids.remove(&old);
            }
            self.dropped.push_back(id);
        }
    }

    /// A pending write dropped before its first transmission, reported as `why`.
    fn drop_unsent(&mut self, r: Record, why: Dropped) {
        self.forget(&r, true);
        if let Some(id) = r.tag.message_id {
            self.remember_dropped(id);
            self.report(match why {
                Dropped::Squashed => MessageReport::Squashed { id },
                Dropped::Expired => MessageReport::Expired { id },
            });
        }
    }

    /// Drops the pending messages whose deadline has passed and that no live message depends
    /// on (Hollywood §4.2). Returns how many were dropped.
    pub(crate) fn expire(&mut self, now: Instant) -> usize {
        self.resolve(now);
        let mut dropped = 0;
        while let Some(&(t, serial)) = self.expiry.first() {
            if t > now {
                break;
            }
            self.expiry.pop_first();
            // Serial 0 asks for a re-check of every pending message due by now.
            let due: Vec<(usize, Option<Instant>, u64)> = self
                .pending
                .iter()
                .enumerate()
                .filter(|(_, r)| {
                    r.kind == Kind::Message
                        && (r.serial == serial
                            || (serial == 0 && r.tag.deadline.is_some_and(|d| d <= now)))
                })
                .map(|(i, r)| {
                    (
                        i,
                        self.keep_until(r.deadline(), r.tag.message_id, 0),
                        r.serial,
                    )
                })
                .collect();
            for (i, until, serial) in due.into_iter().rev() {
                match until {
                    Some(until) if until <= now => {
                        if let Some(r) = self.pending.remove(i) {
                            self.pending_bytes -= r.data.len();
                            self.stats.messages_expired += 1;
                            dropped += 1;
                            self.drop_unsent(r, Dropped::Expired);
                        }
                    }
                    Some(until) => {
                        self.expiry.insert((until, serial));
                    }
                    // Kept by a dependent without deadline: checked again if that one goes.
                    None => {}
                }
            }
        }
        dropped
    }

    /// When [`expire`](Self::expire) has work next.
    pub(crate) fn next_expiry(&self) -> Option<Instant> {
        self.expiry.first().map(|&(t, _)| t)
    }

    /// Removes every pending (wholly untransmitted) write with this squash key that nothing
    /// live depends on (Minion §4.2). Returns the bytes removed.
    pub fn squash(&mut self, now: Instant, key: u64) -> usize {
        let mut removed = 0;
        let mut i = 0;
        while i < self.pending.len() {
            let r = &self.pending[i];
            if r.tag.squash_key == Some(key) && !self.has_live_dependents(r.tag.message_id, now) {
                if let Some(r) = self.pending.remove(i) {
                    removed += r.data.len();
                    self.pending_bytes -= r.data.len();
                    if r.kind == Kind::Message {
                        self.stats.messages_squashed += 1;
                    }
                    self.drop_unsent(r, Dropped::Squashed);
                }
            } else {
                i += 1;
            }
        }
        removed
    }

    /// Length of the next segment starting at `from` (which must lie in `[una, end)`), at
    /// most `max` bytes. A segment never crosses the boundary of a message, so that each
    /// message starts a segment (Hollywood §4.2 consistent segmentation); with `consistent`,
    /// not the boundary of any write either.
    pub(crate) fn segment_len(&self, from: u64, max: usize, consistent: bool) -> usize {
        if from < self.una || from >= self.end() {
            return 0;
        }
        let avail = (self.end() - from) as usize;
        let mut n = avail.min(max) as u64;
        // Walk the writes the segment would cover, stopping at the first boundary it may not
        // cross.
        let mut stop = |start: u64, end: u64, kind: Kind| -> bool {
            if end <= from {
                return false;
            }
            let message = kind != Kind::Bytes;
            if start > from && (message || consistent) {
                // A write that begins inside the segment and must begin a segment itself.
                n = n.min(start - from);
                return true;
            }
            if message || consistent {
                n = n.min(end - from);
                return true;
            }
            from + n <= end
        };
        if from < self.committed_end {
            let i = self.committed.partition_point(|r| r.end() <= from);
            for r in self.committed.range(i..) {
                if stop(r.start, r.end(), r.kind) {
                    return n as usize;
                }
            }
        }
        let mut start = self.committed_end;
        for r in &self.pending {
            let end = start + r.data.len() as u64;
            if stop(start, end, r.kind) {
                break;
            }
            start = end;
        }
        n as usize
    }

    /// Length of the write that starts at `from`, if a message starts there (consistent
    /// segmentation never splits a message that fits in one segment).
    pub(crate) fn message_at(&self, from: u64) -> Option<usize> {
        if from < self.committed_end {
            let i = self.committed.partition_point(|r| r.end() <= from);
            let r = self.committed.get(i)?;
            return (r.start == from && r.kind == Kind::Message).then_some(r.data.len());
        }
        let mut start = self.committed_end;
        for r in &self.pending {
            if start == from {
                return (r.kind == Kind::Message).then_some(r.data.len());
            }
            start += r.data.len() as u64;
            if start > from {
                break;
            }
        }
        None
    }

    /// Copies bytes starting at `from` into `out`, committing the pending writes this reaches
    /// (their first byte is being transmitted, so their offsets become fixed).
    pub(crate) fn copy_out(&mut self, from: u64, out: &mut [u8]) {
        let to = from + out.len() as u64;
        while self.committed_end < to {
            let Some(mut r) = self.pending.pop_front() else {
                break;
            };
            r.start = self.committed_end;
            self.committed_end = r.end();
            self.pending_bytes -= r.data.len();
            if let Some(id) = r.tag.message_id {
                self.report(MessageReport::Sent {
                    id,
                    replacement: false,
                });
            }
            self.committed.push_back(r);
        }
        let mut i = self.committed.partition_point(|r| r.end() <= from);
        let mut pos = from;
        let mut written = 0;
        while written < out.len() {
            let Some(r) = self.committed.get(i) else {
                break;
            };
            let off = (pos - r.start) as usize;
            let n = (r.data.len() - off).min(out.len() - written);
            out[written..written + n].copy_from_slice(&r.data[off..off + n]);
            written += n;
            pos += n as u64;
            i += 1;
        }
    }

    /// Drops everything below `upto` (cumulative acknowledgment).
    pub(crate) fn ack(&mut self, upto: u64) {
        let upto = upto.min(self.committed_end);
        if upto <= self.una {
            return;
        }
        self.una = upto;
        while let Some(front) = self.committed.front_mut() {
            if front.end() > upto {
                // Partly acknowledged: part of it has arrived (Hollywood §4.2: never replace
                // part of a message). One that starts at `upto` has not.
                if front.start < upto {
                    front.received = true;
                }
                break;
            }
            let Some(r) = self.committed.pop_front() else {
                break;
            };
            if r.kind == Kind::Message
                && r.tag.deadline.is_some()
                && let Some(id) = r.tag.message_id
                && !self.settled.contains(&id)
            {
                self.report(MessageReport::Acked { id });
                if self.copies_of(id) > 1 {
                    // Another copy is still in flight: whatever becomes of it, the message
                    // has arrived.
                    self.settled.insert(id);
                }
            }
            self.forget(&r, false);
        }
    }

    /// Notes that the receiver holds `[from, to)` (a SACK block): the committed writes it
    /// touches may not be replaced any more.
    pub(crate) fn mark_received(&mut self, from: u64, to: u64) {
        let i = self.committed.partition_point(|r| r.end() <= from);
        for r in self.committed.range_mut(i..) {
            if r.start >= to {
                break;
            }
            r.received = true;
        }
    }

    /// Before a retransmission of `[from, to)`: replaces each run of whole messages in it that
    /// will have expired on `arrival`, that nothing live depends on and of which no part is
    /// known received, by live messages with a deadline (a message without one must arrive,
    /// and a replacement may not): pending ones, or copies of ones in flight — closest to
    /// expiry first, no more than fit —
    /// followed by padding to exactly the run's length (Hollywood §4.2 inconsistent
    /// retransmissions). Padding from an earlier replacement counts as expired. A run of
    /// messages no live message fits into becomes padding alone (its messages would only
    /// arrive late); a run of earlier padding no live message fits into, or one shorter than
    /// the padder's shortest padding, is left as it is. Never changes the length of anything,
    /// never replaces part of a message.
    #[cfg(test)]
    pub(crate) fn replace_expired(
        &mut self,
        from: u64,
        to: u64,
        now: Instant,
        arrival: Instant,
        padder: &Padder,
    ) -> Replacement {
        self.replace_expired_with(from, to, now, arrival, padder, true)
    }

    /// The replacement described at `replace_expired` (which is this with `move_pending`
    /// true); with `move_pending` false only copies of messages in
    /// flight fill a run (or padding), never a pending message. A retransmission sent on a
    /// presumption of loss rather than evidence — a retransmission timeout's go-back-N, a
    /// tail loss probe — is often spurious, and then the receiver keeps the original bytes
    /// of the range and drops the retransmission: a pending message moved into it would be
    /// lost although the network delivered every packet (issue 14: lost ACKs made the
    /// timeout fire, and `utcp-ir` missed messages `utcp` delivered). A copy costs nothing
    /// then: its original is still in flight.
    pub(crate) fn replace_expired_with(
        &mut self,
        from: u64,
        to: u64,
        now: Instant,
        arrival: Instant,
        padder: &Padder,
        move_pending: bool,
    ) -> Replacement {
        let mut done = Replacement::default();
        self.resolve(now);
        let first = self.committed.partition_point(|r| r.end() <= from);
        // Runs of replaceable records: (first index, one past the last index).
        let mut runs: Vec<(usize, usize)> = Vec::new();
        let mut i = first;
        while let Some(r) = self.committed.get(i) {
            if r.start >= to {
                break;
            }
            let inside = r.start >= from && r.end() <= to && r.start >= self.una;
            let replaceable = inside
                && !r.received
                && match r.kind {
                    Kind::Padding => true,
                    Kind::Bytes => false,
                    Kind::Message => self
                        .keep_until(r.deadline(), r.tag.message_id, 0)
                        .is_some_and(|t| t <= arrival),
                };
            if replaceable {
                match runs.last_mut() {
                    Some(last) if last.1 == i => last.1 = i + 1,
                    _ => runs.push((i, i + 1)),
                }
            }
            i += 1;
        }
        // Replace from the last run backwards so that earlier indices stay valid.
        for &(a, b) in runs.iter().rev() {
            // A run of nothing but padding from an earlier replacement is only worth it if a
            // message fills it; a run with messages too.
            if let Some(r) = self.fill_run(a, b, arrival, padder, move_pending) {
                done.ranges += 1;
                done.replaced += r.0;
                done.replacements += r.1;
            }
        }
        done
    }

    /// Replaces committed records `a..b` (one contiguous run) if any live pending message
    /// fits. Returns (messages replaced, messages sent as replacements).
    fn fill_run(
        &mut self,
        a: usize,
        b: usize,
        arrival: Instant,
        padder: &Padder,
        move_pending: bool,
    ) -> Option<(u64, u64)> {
        let start = self.committed[a].start;
        let end = self.committed[b - 1].end();
        let len = (end - start) as usize;
        // Candidates (Hollywood §4.2: every complete message in the send queue): live
        // messages with a deadline, closest to expiry first, then pending before in flight,
        // then in queue order. Pending ones move into the range; in-flight ones — transmitted,
        // not acknowledged, no part known received, carried by the queue once — are copied,
        // a second chance for a live message whose first transmission may be lost too. A
        // message without a deadline must arrive, and a replacement may not: a
        // retransmission-caching middlebox restores the original bytes (Hollywood §4.5), and
        // after a spurious retransmission the receiver already holds the original range.
        let live = |r: &Record| {
            if r.kind != Kind::Message || r.deadline() == Deadline::Never || r.data.len() > len {
                return None;
            }
            match self.keep_until(r.deadline(), r.tag.message_id, 0) {
                Some(t) if t <= arrival => None,
                until => Some(until),
            }
        };
        let mut candidates: Vec<(Option<Instant>, Source, usize)> = Vec::new();
        for (i, r) in self.pending.iter().enumerate().filter(|_| move_pending) {
            if let Some(until) = live(r) {
                candidates.push((until, Source::Pending(i), r.data.len()));
            }
        }
        for (i, r) in self.committed.iter().enumerate() {
            if (a..b).contains(&i) || r.received || r.start < self.una {
                continue;
            }
            let once = r.tag.message_id.is_some_and(|id| self.copies_of(id) == 1);
            if once && let Some(until) = live(r) {
                candidates.push((until, Source::InFlight(i), r.data.len()));
            }
        }
        // A run that holds messages is doomed whether or not a live message fills it: resent
        // unchanged it would only deliver them late, and during a burst of losses the few
        // live messages in flight are used up by the first runs (issue 14: every run after
        // the first one or two went out unchanged). It then goes as padding, so the receiver
        // gets nothing late and the path carries no dead bytes; a run of nothing but padding
        // from an earlier replacement is only worth resending changed if a message fills it.
        let doomed_messages = self.committed.range(a..b).any(|r| r.kind == Kind::Message);
        if candidates.is_empty() && !doomed_messages {
            return None;
        }
        candidates.sort_by_key(|&(until, source, _)| (until.is_none(), until, source));
        // The padder's shortest padding: a candidate that would leave less is skipped.
        let min_padding = padder.min_len();
        let mut chosen: Vec<Source> = Vec::new();
        let mut left = len;
        for &(_, source, n) in &candidates {
            if n == left || (n < left && left - n >= min_padding) {
                chosen.push(source);
                left -= n;
            }
            if left == 0 {
                break;
            }
        }
        if (chosen.is_empty() && !doomed_messages) || (left > 0 && left < min_padding) {
            return None;
        }
        let mut padding = Vec::new();
        if !padder.pad(start..end, left, &mut padding) {
            return None;
        }
        if padding.len() != left {
            tracing::warn!(
                wanted = left,
                got = padding.len(),
                "padder wrote the wrong length; retransmitting the original bytes"
            );
            return None;
        }
        // Take pending replacements out of the pending queue (they are not sent again at
        // their original time, Hollywood §4.2) and copy in-flight ones, in the order chosen.
        let mut taken: Vec<Option<(Record, bool)>> = (0..chosen.len()).map(|_| None).collect();
        for (k, source) in chosen.iter().enumerate() {
            if let Source::InFlight(i) = *source {
                let r = &self.committed[i];
                let copy = Record {
                    start: 0,
                    data: r.data.clone(),
                    tag: r.tag,
                    kind: Kind::Message,
                    serial: 0,
                    lifetime: None,
                    received: false,
                };
                taken[k] = Some((copy, true));
            }
        }
        let mut pending_order: Vec<(usize, usize)> = chosen
            .iter()
            .enumerate()
            .filter_map(|(k, source)| match *source {
                Source::Pending(i) => Some((k, i)),
                Source::InFlight(_) => None,
            })
            .collect();
        pending_order.sort_by_key(|&(_, i)| std::cmp::Reverse(i));
        for (k, i) in pending_order {
            if let Some(r) = self.pending.remove(i) {
                self.pending_bytes -= r.data.len();
                taken[k] = Some((r, false));
            }
        }
        let copies_made = chosen
            .iter()
            .filter(|s| matches!(s, Source::InFlight(_)))
            .count() as u64;
        let mut fresh: Vec<Record> = Vec::with_capacity(taken.len() + 1);
        let mut pos = start;
        let mut sent_as_replacement = 0;
        for (mut r, copy) in taken.into_iter().flatten() {
            r.start = pos;
            pos = r.end();
            if copy {
                // The message was reported sent at its first transmission; the queue now
                // carries it twice.
                r.serial = self.serial();
                if let Some(id) = r.tag.message_id {
                    *self.ids.entry(id).or_insert(0) += 1;
                }
                self.stats.replacement_copies += 1;
            } else if let Some(id) = r.tag.message_id {
                self.report(MessageReport::Sent {
                    id,
                    replacement: true,
                });
            }
            sent_as_replacement += 1;
            fresh.push(r);
        }
        if !padding.is_empty() {
            let serial = self.serial();
            self.stats.padding_bytes += padding.len() as u64;
            fresh.push(Record {
                start: pos,
                data: padding,
                tag: WriteTag::default(),
                kind: Kind::Padding,
                serial,
                lifetime: None,
                received: false,
            });
        }
        let mut tail = self.committed.split_off(a);
        let rest = tail.split_off(b - a);
        let mut replaced = 0;
        for old in tail {
            if old.kind == Kind::Message {
                replaced += 1;
                // With another copy still in flight (or one already acknowledged) the message
                // may yet arrive: that copy's fate is the message's.
                if let Some(id) = old.tag.message_id
                    && self.copies_of(id) == 1
                    && !self.settled.contains(&id)
                {
                    self.report(MessageReport::Replaced { id });
                }
            }
            self.forget(&old, true);
        }
        self.committed.extend(fresh);
        self.committed.extend(rest);
        self.stats.messages_replaced += replaced;
        self.stats.replacement_messages += sent_as_replacement - copies_made;
        self.stats.replaced_ranges += 1;
        Some((replaced, sent_as_replacement))
    }

    /// Committed writes overlapping `[from, to)`, for inspection.
    pub fn committed_writes(&self, from: u64, to: u64) -> Vec<CommittedWrite> {
        let i = self.committed.partition_point(|r| r.end() <= from);
        self.committed
            .range(i..)
            .take_while(|r| r.start < to)
            .map(|r| CommittedWrite {
                start: r.start,
                len: r.data.len(),
                tag: r.tag,
            })
            .collect()
    }

    /// Tags of the pending writes in queue order, with their lengths.
    pub fn pending_writes(&self) -> impl Iterator<Item = (usize, &WriteTag)> {
        self.pending.iter().map(|r| (r.data.len(), &r.tag))
    }

    /// Panics if the queue is inconsistent (records contiguous, counts match).
    pub(crate) fn check_invariants(&self) {
        let mut pos = self
            .committed
            .front()
            .map_or(self.committed_end, |r| r.start);
        for r in &self.committed {
            assert_eq!(r.start, pos, "committed records are contiguous");
            pos = r.end();
        }
        assert_eq!(pos, self.committed_end);
        if let Some(f) = self.committed.front() {
            assert!(f.start <= self.una && self.una < f.end());
        }
        let pending: usize = self.pending.iter().map(|r| r.data.len()).sum();
        assert_eq!(pending, self.pending_bytes);
        let unresolved = self
            .pending
            .iter()
            .chain(&self.committed)
            .filter(|r| r.lifetime.is_some())
            .count();
        assert_eq!(unresolved, self.unresolved);
    }
}

#[cfg(test)]
mod tests;
