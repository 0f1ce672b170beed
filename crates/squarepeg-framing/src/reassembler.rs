//! Offset-addressed fragment reassembly: the receive side when TCP segments
//! reach the application out of order, each with its stream offset
//! (Minion §4.1: data may arrive more than once, in any order, overlapping).
//!
//! Received bytes are fitted together by offset into *islands*, maximal
//! contiguous ranges (Minion §5.2: a segment creates an island, extends one
//! at either end, or fills the hole between two and merges them). Every run
//! of non-zero bytes with a zero marker on both sides and no hole is a frame
//! (Minion §5.3), and is decoded the moment its last byte arrives: a frame
//! wholly inside an out-of-order segment, one completed by filling a hole,
//! one whose leading marker ended an earlier segment. Each island remembers
//! its first and last marker; every run between them has been handled, so a
//! merge scans only the new bytes and the runs crossing the old islands'
//! edges, never an old island's interior again.
//!
//! The island that starts the window (island 0) holds everything up to the
//! in-order point; once its frames are handled only its tail from the last
//! marker is kept and the rest is released. A new segment that extends it
//! and touches no other island (the common case: consistent segmentation,
//! each segment holding whole frames, Hollywood §4.2) is decoded straight
//! from the caller's slice; only a partial frame at its end is copied.
//!
//! ## Conflicting bytes
//!
//! A segment whose bytes differ from bytes already held at the same offsets
//! comes from an inconsistent retransmission (Hollywood §4.2) or from a
//! middlebox that mixed two transmissions of the same range (§4.5). The
//! reassembler keeps the bytes it received first; the frames they form are
//! the ones found in place (a frame mixing the two transmissions fails its
//! CRC and is reported). It also scans the new segment on its own and
//! yields every checksum-valid frame that lies wholly inside it and touches
//! a conflicting byte. Such a frame is yielded once per (start offset,
//! encoded length, CRC32C of the encoding); a *different* valid frame at
//! the same offset is a different frame and is yielded once too.
//!
//! ## What the layer above must still do
//!
//! Exactly once here means once per frame *at a stream position*. The same
//! message can still arrive twice: a sender may send a message in its
//! original place and again as an inconsistent retransmission elsewhere
//! (Hollywood §4.2, "cannot guarantee"), and bytes below the released point
//! are not scanned again. The session layer deduplicates by message number
//! (and stream chunks by stream offset). Padding frames are yielded like
//! any other; the session discards them.
//!
//! ## Memory
//!
//! The bytes held lie in a window that starts at the oldest incomplete
//! frame's leading marker; [`Reassembler::held_bytes`] counts the window
//! (holes included) plus a fixed charge for the bookkeeping of each
//! out-of-order island and each remembered conflicting frame, and never
//! exceeds the configured limit. An out-of-order segment that would need
//! more is refused with [`ReassemblyError::LimitExceeded`] (nothing of it is
//! kept); a segment that extends the in-order point is always accepted,
//! since handling it never holds more than one partial frame. A frame
//! longer than the body limit is reported once and its bytes dropped as
//! they become in-order. Choose the limit at least as large as the TCP
//! receive window plus one maximal frame, and no segment TCP accepts is
//! ever refused. Decoded frames wait in an output queue until
//! [`Reassembler::next_frame`] takes them: drain it after each insert.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use crate::{Frame, FrameError, cobs, frame};

/// Bookkeeping charged against the limit for each out-of-order island.
pub const ISLAND_COST: usize = 64;

/// Bookkeeping charged against the limit for each frame remembered from a
/// conflicting segment.
pub const CONFLICT_FRAME_COST: usize = 48;

/// Slack above one maximal frame that [`Reassembler::min_limit`] requires,
/// so that a maximal frame can arrive in a few out-of-order pieces.
const MIN_LIMIT_SLACK: usize = 16 * ISLAND_COST;

/// A frame found in the stream, with the stream offset of its leading
/// marker.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReassembledFrame {
    pub offset: u64,
    pub frame: Frame,
}

/// Bytes between two markers that are not a valid frame (bad checksum,
/// header, encoding, or over the body limit), or bytes before the first
/// marker of the stream. `offset` is the stream offset of the leading
/// marker (0 for bytes before the first marker).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("bad frame at stream offset {offset}: {error}")]
pub struct RejectedFrame {
    pub offset: u64,
    pub error: FrameError,
}

/// Why a range of bytes was refused. The reassembler stays usable.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ReassemblyError {
    /// Holding the range would take the reassembler over its memory limit.
    /// Nothing of the range was kept (for an out-of-order range), or a frame
    /// found only in its conflicting bytes was dropped (for a range that
    /// extended the in-order point).
    #[error(
        "bytes {start}..{end} would need {needed} bytes of reassembly memory, over the limit of {limit}"
    )]
    LimitExceeded {
        start: u64,
        end: u64,
        needed: usize,
        limit: usize,
    },
    /// The range ends more than the limit beyond the in-order point: no
    /// limit-respecting sender or TCP can produce it.
    #[error(
        "bytes {start}..{end} end more than the limit of {limit} bytes beyond the in-order point {in_order}"
    )]
    TooFarAhead {
        start: u64,
        end: u64,
        in_order: u64,
        limit: usize,
    },
    /// The range's end does not fit a 64-bit stream offset.
    #[error("{len} bytes at stream offset {offset} overflow the stream offset space")]
    RangeOverflow { offset: u64, len: usize },
    /// The configured limit cannot hold one frame of the configured body
    /// limit.
    #[error("a reassembly limit of {limit} bytes cannot hold one maximal frame (needs {min})")]
    LimitTooSmall { limit: usize, min: usize },
}

/// Counters describing what the reassembler has seen.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReassemblyStats {
    /// Frames yielded.
    pub frames: u64,
    /// Bad frames reported.
    pub rejected: u64,
    /// Inserted bytes that were already held or already released.
    pub duplicate_bytes: u64,
    /// Inserts whose bytes differed from bytes already held.
    pub conflicts: u64,
    /// Frames yielded from the conflicting bytes of a segment.
    pub conflict_frames: u64,
    /// Invalid or already-yielded runs in conflicting bytes (not reported).
    pub conflict_ignored: u64,
}

/// A maximal contiguous range of held bytes, `start..end` (the start is the
/// map key).
#[derive(Clone, Copy, Debug)]
struct Island {
    end: u64,
    first_zero: Option<u64>,
    last_zero: Option<u64>,
    /// The run after `last_zero` is longer than any frame and has been
    /// reported.
    oversize_reported: bool,
}

/// A piece of a merged island, in stream order.
enum Piece {
    /// Bytes this insert wrote, `start..end`.
    New(u64, u64),
    /// An island that was held before this insert.
    Old(Island),
}

/// Reassembles frames from byte ranges arriving in any order.
#[derive(Debug)]
pub struct Reassembler {
    max_body: usize,
    max_encoded: usize,
    limit: usize,
    /// Stream offset of `buf[head]`; bytes below it are released.
    base: u64,
    /// The window: `buf[head..]` holds stream bytes from `base` up to the
    /// end of the last island (holes hold stale bytes).
    buf: Vec<u8>,
    head: usize,
    /// Island 0, the one starting at `base` (it holds the in-order data).
    island0: Option<Island>,
    /// The out-of-order islands, by start offset (all above `base`).
    islands: BTreeMap<u64, Island>,
    /// Frames yielded from conflicting bytes, by (offset, encoded length,
    /// CRC32C of the encoding), for exactly-once.
    conflict_frames: BTreeSet<(u64, usize, u32)>,
    ready: VecDeque<Result<ReassembledFrame, RejectedFrame>>,
    stats: ReassemblyStats,
    #[cfg(test)]
    pub(crate) no_fast_path: bool,
}

impl Reassembler {
    /// The smallest limit [`Reassembler::new`] accepts for `max_body`: one
    /// maximal frame with its markers, plus a little bookkeeping.
    pub fn min_limit(max_body: usize) -> usize {
        cobs::max_encoded_len(max_body)
            .saturating_add(2)
            .saturating_add(MIN_LIMIT_SLACK)
    }

    /// A reassembler for a stream that starts at offset 0 with a marker,
    /// rejecting frames whose body exceeds `max_body` bytes and holding at
    /// most `limit` bytes (see the module docs).
    pub fn new(max_body: usize, limit: usize) -> Result<Self, ReassemblyError> {
        let min = Self::min_limit(max_body);
        if limit < min {
            return Err(ReassemblyError::LimitTooSmall { limit, min });
        }
        Ok(Self::with_limit(max_body, limit))
    }

    pub(crate) fn with_limit(max_body: usize, limit: usize) -> Self {
        Self {
            max_body,
            max_encoded: cobs::max_encoded_len(max_body),
            limit,
            base: 0,
            buf: Vec::new(),
            head: 0,
            island0: None,
            islands: BTreeMap::new(),
            conflict_frames: BTreeSet::new(),
            ready: VecDeque::new(),
            stats: ReassemblyStats::default(),
            #[cfg(test)]
            no_fast_path: false,
        }
    }

    /// The body limit.
    pub fn max_body(&self) -> usize {
        self.max_body
    }

    /// The memory limit.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Counters.
    pub fn stats(&self) -> &ReassemblyStats {
        &self.stats
    }

    /// The in-order point: every byte below it has been received.
    pub fn in_order_offset(&self) -> u64 {
        self.island0().map_or(self.base, |i| i.end)
    }

    /// Bytes charged against the limit (see the module docs).
    pub fn held_bytes(&self) -> usize {
        let ooo = self.islands.len();
        (self.buf.len() - self.head)
            + ooo * ISLAND_COST
            + self.conflict_frames.len() * CONFLICT_FRAME_COST
    }

    /// Bytes received after the last marker of the in-order data: the
    /// partial frame waiting for its end.
    pub fn partial_frame_len(&self) -> usize {
        match self.island0() {
            Some(i) if i.first_zero == Some(self.base) => (i.end - self.base - 1) as usize,
            _ => 0,
        }
    }

    /// Frames decoded and waiting for [`Reassembler::next_frame`].
    pub fn ready_len(&self) -> usize {
        self.ready.len()
    }

    /// The next frame found, or a report of bytes that are not a frame.
    /// `None` when nothing is waiting.
    pub fn next_frame(&mut self) -> Option<Result<ReassembledFrame, RejectedFrame>> {
        self.ready.pop_front()
    }

    fn island0(&self) -> Option<&Island> {
        self.island0.as_ref()
    }

    fn idx(&self, offset: u64) -> usize {
        self.head + (offset - self.base) as usize
    }

    /// Stream offset one past the last byte the window covers.
    fn window_end(&self) -> u64 {
        self.base + (self.buf.len() - self.head) as u64
    }

    /// Accepts the bytes `data` found at stream offset `offset`. Frames
    /// completed by them become available from
    /// [`Reassembler::next_frame`].
    pub fn insert(&mut self, offset: u64, data: &[u8]) -> Result<(), ReassemblyError> {
        let end = offset
            .checked_add(data.len() as u64)
            .ok_or(ReassemblyError::RangeOverflow {
                offset,
                len: data.len(),
            })?;
        if data.is_empty() {
            return Ok(());
        }
        // Bytes below the window were handled and released; TCP would drop
        // them as duplicates too.
        if end <= self.base {
            self.stats.duplicate_bytes += data.len() as u64;
            return Ok(());
        }
        let (start, data) = if offset < self.base {
            let cut = (self.base - offset) as usize;
            self.stats.duplicate_bytes += cut as u64;
            (self.base, &data[cut..])
        } else {
            (offset, data)
        };
        let in_order = self.in_order_offset();
        if start > in_order {
            self.check_room(start, end, in_order)?;
        }
        let mut result = Ok(());
        if self.conflicts(start, data) {
            self.stats.conflicts += 1;
            result = self.scan_conflicting(start, data);
        }
        let fast = start <= in_order && self.next_ooo_start().is_none_or(|s| s > end);
        #[cfg(test)]
        let fast = fast && !self.no_fast_path;
        if fast {
            if end > in_order {
                let new = &data[(in_order - start) as usize..];
                self.stats.duplicate_bytes += in_order - start;
                self.extend_in_order(in_order, new);
            } else {
                self.stats.duplicate_bytes += data.len() as u64;
            }
        } else if start <= in_order && self.next_ooo_start().is_some() && end > self.window_end() {
            // In order, filling holes and running on past the last island:
            // merge up to its end, then stream the rest like the fast path,
            // so that no more than the window is ever copied.
            let cut = (self.window_end() - start) as usize;
            self.merge(start, &data[..cut]);
            self.extend_in_order(start + cut as u64, &data[cut..]);
        } else {
            self.merge(start, data);
        }
        result
    }

    /// Refuses an out-of-order range the limit cannot hold.
    fn check_room(&self, start: u64, end: u64, in_order: u64) -> Result<(), ReassemblyError> {
        if end - in_order > self.limit as u64 {
            return Err(ReassemblyError::TooFarAhead {
                start,
                end,
                in_order,
                limit: self.limit,
            });
        }
        // Out of order: island 0 ends before `start` and is not touched.
        let touched = self.touching(start, end).count();
        let ooo_after = self.islands.len() + 1 - touched;
        let span = (self.window_end().max(end) - self.base) as usize;
        let needed =
            span + ooo_after * ISLAND_COST + self.conflict_frames.len() * CONFLICT_FRAME_COST;
        if needed > self.limit {
            return Err(ReassemblyError::LimitExceeded {
                start,
                end,
                needed,
                limit: self.limit,
            });
        }
        Ok(())
    }

    /// Islands overlapping or adjacent to `start..end` (with `start` at or
    /// above `base`), as (start, island), in ascending order.
    fn touching(&self, start: u64, end: u64) -> impl Iterator<Item = (u64, &Island)> {
        let first = self
            .island0
            .as_ref()
            .filter(|island| island.end >= start)
            .map(|island| (self.base, island));
        // An island starting below `start` touches only if it reaches it;
        // islands are disjoint, so only the last such one can.
        let before = self
            .islands
            .range(..start)
            .next_back()
            .filter(|(_, island)| island.end >= start);
        let within = self.islands.range(start..=end);
        first.into_iter().chain(
            before
                .into_iter()
                .chain(within)
                .map(|(&s, island)| (s, island)),
        )
    }

    fn next_ooo_start(&self) -> Option<u64> {
        self.islands.first_key_value().map(|(&s, _)| s)
    }

    /// Whether any byte of `data` (at `start`) differs from a byte held at
    /// the same offset.
    fn conflicts(&self, start: u64, data: &[u8]) -> bool {
        let end = start + data.len() as u64;
        self.touching(start, end).any(|(s, island)| {
            let a = s.max(start);
            let b = island.end.min(end);
            a < b
                && self.buf[self.idx(a)..self.idx(b)]
                    != data[(a - start) as usize..(b - start) as usize]
        })
    }

    /// Finds the checksum-valid frames lying wholly inside `data` whose
    /// bytes differ somewhere from the bytes held (the held bytes win in
    /// the window; these frames would otherwise be lost).
    fn scan_conflicting(&mut self, start: u64, data: &[u8]) -> Result<(), ReassemblyError> {
        let mut result = Ok(());
        let mut zeros = memchr::memchr_iter(0, data);
        let Some(mut prev) = zeros.next() else {
            return result;
        };
        for z in zeros {
            let (a, b) = (prev, z);
            prev = z;
            if b == a + 1 {
                continue;
            }
            let (lo, hi) = (start + a as u64, start + b as u64 + 1);
            let differs = self.touching(lo, hi).any(|(s, island)| {
                let x = s.max(lo);
                let y = island.end.min(hi);
                x < y
                    && self.buf[self.idx(x)..self.idx(y)]
                        != data[(x - start) as usize..(y - start) as usize]
            });
            if !differs {
                // Identical to the held bytes: found in place, if at all.
                continue;
            }
            let encoded = &data[a + 1..b];
            let Ok(frame) = frame::decode_run(encoded, self.max_body) else {
                self.stats.conflict_ignored += 1;
                continue;
            };
            let id = (lo, encoded.len(), crate::crc::crc32c(&[encoded]));
            if self.conflict_frames.contains(&id) {
                self.stats.conflict_ignored += 1;
                continue;
            }
            let needed = self.held_bytes() + CONFLICT_FRAME_COST;
            if needed > self.limit {
                result = Err(ReassemblyError::LimitExceeded {
                    start,
                    end: start + data.len() as u64,
                    needed,
                    limit: self.limit,
                });
                continue;
            }
            self.conflict_frames.insert(id);
            self.stats.conflict_frames += 1;
            self.stats.frames += 1;
            self.ready
                .push_back(Ok(ReassembledFrame { offset: lo, frame }));
        }
        result
    }

    /// Queues the outcome of decoding the run after the marker at `offset`.
    fn emit(
        ready: &mut VecDeque<Result<ReassembledFrame, RejectedFrame>>,
        stats: &mut ReassemblyStats,
        max_body: usize,
        offset: u64,
        encoded: &[u8],
    ) {
        match frame::decode_run(encoded, max_body) {
            Ok(frame) => {
                stats.frames += 1;
                ready.push_back(Ok(ReassembledFrame { offset, frame }));
            }
            Err(error) => Self::reject(ready, stats, offset, error),
        }
    }

    fn reject(
        ready: &mut VecDeque<Result<ReassembledFrame, RejectedFrame>>,
        stats: &mut ReassemblyStats,
        offset: u64,
        error: FrameError,
    ) {
        stats.rejected += 1;
        ready.push_back(Err(RejectedFrame { offset, error }));
    }

    /// The fast path: `new` (at `at`, the in-order point) extends island 0
    /// and touches no other island. Frames wholly inside `new` are decoded
    /// from it directly; only the partial frame at its end is copied.
    fn extend_in_order(&mut self, at: u64, new: &[u8]) {
        let end = at + new.len() as u64;
        // Island 0 always starts with its only marker (see `release`); no
        // island 0 means the bytes at `at` continue garbage or an oversize
        // frame, up to the next marker.
        let marker = self.island0().map(|_| self.base);
        if at == 0 && new[0] != 0 {
            Self::reject(
                &mut self.ready,
                &mut self.stats,
                0,
                FrameError::before_first_marker(new),
            );
        }
        let mut zeros = memchr::memchr_iter(0, new);
        let Some(first) = zeros.next() else {
            match marker {
                Some(m) if (end - m - 1) as usize <= self.max_encoded => {
                    self.write(at, new);
                    if let Some(island) = self.island0.as_mut() {
                        island.end = end;
                    }
                }
                Some(m) => {
                    self.report_oversize(m);
                    self.island0 = None;
                    self.advance_base(end);
                }
                None => self.advance_base(end),
            }
            return;
        };
        if let Some(m) = marker
            && (first > 0 || at > m + 1)
        {
            // The run that began before this range ends at `first`.
            if at == m + 1 {
                Self::emit(
                    &mut self.ready,
                    &mut self.stats,
                    self.max_body,
                    m,
                    &new[..first],
                );
            } else {
                self.write(at, &new[..first]);
                let (a, b) = (self.idx(m + 1), self.idx(at + first as u64));
                Self::emit(
                    &mut self.ready,
                    &mut self.stats,
                    self.max_body,
                    m,
                    &self.buf[a..b],
                );
            }
        }
        let mut last = first;
        for z in zeros {
            if z > last + 1 {
                Self::emit(
                    &mut self.ready,
                    &mut self.stats,
                    self.max_body,
                    at + last as u64,
                    &new[last + 1..z],
                );
            }
            last = z;
        }
        self.island0 = None;
        let last_zero = at + last as u64;
        let tail = &new[last..];
        if tail.len() - 1 > self.max_encoded {
            self.report_oversize(last_zero);
            self.advance_base(end);
            return;
        }
        self.advance_base(last_zero);
        self.write(last_zero, tail);
        self.island0 = Some(Island {
            end,
            first_zero: Some(last_zero),
            last_zero: Some(last_zero),
            oversize_reported: false,
        });
    }

    /// Rejects the frame at `marker` once its encoding is too long for any body within the
    /// limit (its size is not known then).
    fn report_oversize(&mut self, marker: u64) {
        Self::reject(
            &mut self.ready,
            &mut self.stats,
            marker,
            FrameError::Oversize {
                len: None,
                limit: self.max_body,
            },
        );
    }

    /// Copies `bytes` into the window at stream offset `at`.
    fn write(&mut self, at: u64, bytes: &[u8]) {
        let a = self.idx(at);
        let b = a + bytes.len();
        if self.buf.len() < b {
            self.buf.resize(b, 0);
        }
        self.buf[a..b].copy_from_slice(bytes);
    }

    /// Releases everything below `new_base`.
    fn advance_base(&mut self, new_base: u64) {
        debug_assert!(new_base >= self.base);
        let a = self.head as u64 + (new_base - self.base);
        self.base = new_base;
        if a >= self.buf.len() as u64 {
            self.buf.clear();
            self.head = 0;
        } else {
            self.head = a as usize;
            // Amortised: move the tail down only once the released prefix
            // outweighs it.
            if self.head > 4096 && self.head * 2 > self.buf.len() {
                self.buf.drain(..self.head);
                self.head = 0;
            }
        }
        if self
            .conflict_frames
            .first()
            .is_some_and(|&(o, _, _)| o < new_base)
        {
            self.conflict_frames = self.conflict_frames.split_off(&(new_base, 0, 0));
        }
    }

    /// The general path: writes the new bytes of `data` (at `start`) into
    /// the window, merges the islands it overlaps or touches into one, and
    /// handles every run completed by the merge.
    fn merge(&mut self, start: u64, data: &[u8]) {
        let end = start + data.len() as u64;
        let touched: Vec<(u64, Island)> = self.touching(start, end).map(|(s, &i)| (s, i)).collect();
        for &(s, _) in &touched {
            if s == self.base {
                self.island0 = None;
            } else {
                self.islands.remove(&s);
            }
        }
        // Lay out the merged island as pieces; copy in the bytes not held.
        let mut pieces = Vec::with_capacity(touched.len() * 2 + 1);
        let mut cursor = start;
        let mut merged_start = start;
        let mut merged_end = end;
        for &(s, island) in &touched {
            merged_start = merged_start.min(s);
            merged_end = merged_end.max(island.end);
            if s > cursor {
                self.write(
                    cursor,
                    &data[(cursor - start) as usize..(s - start) as usize],
                );
                pieces.push(Piece::New(cursor, s));
            }
            pieces.push(Piece::Old(island));
            cursor = cursor.max(island.end);
        }
        if cursor < end {
            self.write(cursor, &data[(cursor - start) as usize..]);
            pieces.push(Piece::New(cursor, end));
        }
        let new_bytes: u64 = pieces
            .iter()
            .map(|p| match p {
                Piece::New(a, b) => b - a,
                Piece::Old(_) => 0,
            })
            .sum();
        self.stats.duplicate_bytes += data.len() as u64 - new_bytes;
        if start == 0 && self.base == 0 && data[0] != 0 && !touched.iter().any(|&(s, _)| s == 0) {
            Self::reject(
                &mut self.ready,
                &mut self.stats,
                0,
                FrameError::before_first_marker(data),
            );
        }

        // Walk the markers of the merged island in order. Runs inside an
        // old island were handled when it formed; every other run between
        // two markers is complete for the first time now.
        let mut prev: Option<u64> = None;
        let mut prev_reported = false;
        let mut first_zero = None;
        for piece in &pieces {
            match *piece {
                Piece::New(a, b) => {
                    let mut pos = a;
                    while let Some(zi) = memchr::memchr(0, &self.buf[self.idx(pos)..self.idx(b)]) {
                        let z = pos + zi as u64;
                        pos = z + 1;
                        first_zero.get_or_insert(z);
                        if let Some(p) = prev {
                            self.run(p, z, prev_reported);
                        }
                        prev = Some(z);
                        prev_reported = false;
                    }
                }
                Piece::Old(island) => {
                    if let Some(f) = island.first_zero {
                        first_zero.get_or_insert(f);
                        if let Some(p) = prev {
                            self.run(p, f, prev_reported);
                        }
                        prev = island.last_zero;
                        prev_reported = island.oversize_reported;
                    }
                }
            }
        }
        if let Some(p) = prev
            && !prev_reported
            && (merged_end - p - 1) as usize > self.max_encoded
        {
            self.report_oversize(p);
            prev_reported = true;
        }
        let merged = Island {
            end: merged_end,
            first_zero,
            last_zero: prev,
            oversize_reported: prev_reported,
        };
        if merged_start == self.base {
            self.release(merged);
        } else {
            self.islands.insert(merged_start, merged);
        }
    }

    /// Handles the run between markers `p` and `z` (both held).
    fn run(&mut self, p: u64, z: u64, reported: bool) {
        if z == p + 1 || reported {
            // An empty frame (adjacent markers), or an oversize run already
            // reported when it was still open.
            return;
        }
        let (a, b) = (self.idx(p + 1), self.idx(z));
        Self::emit(
            &mut self.ready,
            &mut self.stats,
            self.max_body,
            p,
            &self.buf[a..b],
        );
    }

    /// Installs `island` as island 0 (it starts at `base`) and releases all
    /// of it but the tail from its last marker; an island without markers
    /// or with an oversize tail is garbage up to its end.
    fn release(&mut self, island: Island) {
        match island.last_zero {
            Some(l) if !island.oversize_reported => {
                self.advance_base(l);
                self.island0 = Some(Island {
                    end: island.end,
                    first_zero: Some(l),
                    last_zero: Some(l),
                    oversize_reported: false,
                });
            }
            _ => {
                self.island0 = None;
                self.advance_base(island.end);
            }
        }
    }
}

#[cfg(test)]
mod tests;
