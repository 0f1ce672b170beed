//! The two halves of a stream: the unsent bytes of the send side and the
//! reassembly buffer of the receive side.
//!
//! The session core never retransmits: the substrate under it (kernel TCP
//! now, squarepeg's TCP later) is reliable, so a byte handed to the
//! transport is done. The receive side still reassembles by stream offset
//! and drops duplicates, because over the out-of-order substrate chunks
//! arrive in any order and more than once (Minion §4.1, §5.2).

use std::collections::{BTreeMap, VecDeque};

use bytes::Bytes;

use crate::Priority;
use crate::error::ProtocolError;

/// Client-initiated streams have even ids, server-initiated odd ones (as in
/// QUIC, RFC 9000 §2.1).
pub(crate) fn initiated_by_client(id: u64) -> bool {
    id & 1 == 0
}

/// The send half: bytes written but not yet handed to the transport.
#[derive(Debug)]
pub(crate) struct SendHalf {
    /// The unsent bytes: a ring, so that bytes handed out leave it without moving the rest.
    buf: VecDeque<u8>,
    /// Stream offset of `buf[0]`: bytes handed to the transport so far.
    pub(crate) offset: u64,
    /// The peer's credit: we may send up to this offset.
    pub(crate) max_data: u64,
    pub(crate) fin_requested: bool,
    pub(crate) fin_sent: bool,
    /// We reset the stream with this code.
    pub(crate) reset: Option<u64>,
    /// The peer asked us to stop (STOP_SENDING) with this code.
    pub(crate) stopped: Option<u64>,
    pub(crate) priority: Priority,
    /// Which connection carries it when the session spans several; `None`: the session's
    /// default.
    pub(crate) path: Option<crate::PathPolicy>,
}

impl SendHalf {
    pub(crate) fn new(max_data: u64) -> Self {
        Self {
            buf: VecDeque::new(),
            offset: 0,
            max_data,
            fin_requested: false,
            fin_sent: false,
            reset: None,
            stopped: None,
            priority: Priority::DEFAULT,
            path: None,
        }
    }

    pub(crate) fn unsent(&self) -> usize {
        self.buf.len()
    }

    /// Buffers up to `limit - unsent` bytes of `data`; returns how many.
    pub(crate) fn write(&mut self, data: &[u8], limit: usize) -> usize {
        let n = data.len().min(limit.saturating_sub(self.unsent()));
        self.buf.extend(&data[..n]);
        n
    }

    /// The next chunk to send given `conn_credit` connection bytes and at
    /// most `chunk` bytes: `(len, fin)`, or `None` if nothing can be sent.
    pub(crate) fn next_chunk(&self, conn_credit: u64, chunk: usize) -> Option<(usize, bool)> {
        if self.is_closed() {
            return None;
        }
        let credit = self.max_data.saturating_sub(self.offset).min(conn_credit);
        // A chunk is contiguous in the ring: one that would wrap stops at its end.
        let contiguous = self.buf.as_slices().0.len();
        let n = (contiguous as u64).min(credit).min(chunk as u64) as usize;
        let fin = self.fin_requested && n == self.unsent();
        (n > 0 || fin).then_some((n, fin))
    }

    /// Bytes of the next chunk (call after `next_chunk`).
    pub(crate) fn peek(&self, len: usize) -> &[u8] {
        &self.buf.as_slices().0[..len]
    }

    /// Marks `len` bytes (and FIN) as handed to the transport.
    pub(crate) fn advance(&mut self, len: usize, fin: bool) {
        self.buf.drain(..len);
        self.offset += len as u64;
        if fin {
            self.fin_sent = true;
        }
    }

    /// Drops unsent bytes (reset); returns the final size.
    pub(crate) fn discard(&mut self) -> u64 {
        self.buf = VecDeque::new();
        self.offset
    }

    /// Whether nothing more will be sent on this half.
    pub(crate) fn is_closed(&self) -> bool {
        self.fin_sent || self.reset.is_some()
    }

    /// Whether the half is blocked on the stream credit alone.
    pub(crate) fn blocked_on_stream_credit(&self) -> bool {
        self.unsent() > 0 && self.offset >= self.max_data
    }
}

/// What reading the receive half gave.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadOutcome {
    /// This many bytes were copied.
    Data(usize),
    /// The stream ended (FIN) and every byte was read.
    Finished,
    /// No bytes are available now.
    Blocked,
}

/// The receive half: chunks by offset, read in order.
#[derive(Debug)]
pub(crate) struct RecvHalf {
    /// Non-overlapping chunks keyed by their original offset; the value is
    /// the bytes and how many of them have been read (only the first chunk
    /// is ever partly read).
    chunks: BTreeMap<u64, (Bytes, usize)>,
    /// Next offset the application reads.
    pub(crate) read_offset: u64,
    /// Highest offset received (one past the last byte).
    pub(crate) highest: u64,
    pub(crate) final_size: Option<u64>,
    /// Credit we advertised: the peer may send up to this offset.
    pub(crate) max_data: u64,
    /// The peer reset the stream with this code.
    pub(crate) reset: Option<u64>,
    /// We stopped reading (STOP_SENDING sent or the handle dropped): data
    /// is discarded as it arrives.
    pub(crate) stopped: bool,
    /// The application has seen the end (FIN or reset).
    pub(crate) done: bool,
    buffered: usize,
}

impl RecvHalf {
    pub(crate) fn new(max_data: u64) -> Self {
        Self {
            chunks: BTreeMap::new(),
            read_offset: 0,
            highest: 0,
            final_size: None,
            max_data,
            reset: None,
            stopped: false,
            done: false,
            buffered: 0,
        }
    }

    pub(crate) fn buffered(&self) -> usize {
        self.buffered
    }

    /// Checks and records the final size `size` (FIN or RESET_STREAM).
    pub(crate) fn set_final_size(&mut self, stream: u64, size: u64) -> Result<(), ProtocolError> {
        if let Some(known) = self.final_size
            && known != size
        {
            return Err(ProtocolError::FinalSize {
                stream,
                known,
                got: size,
            });
        }
        if size < self.highest {
            return Err(ProtocolError::FinalSize {
                stream,
                known: self.highest,
                got: size,
            });
        }
        self.final_size = Some(size);
        Ok(())
    }

    /// Accepts a chunk. Returns how far `highest` grew (the bytes newly
    /// counted against connection credit). Duplicated and overlapping bytes
    /// are dropped; data past the credit or the final size is an error.
    pub(crate) fn insert(
        &mut self,
        stream: u64,
        offset: u64,
        data: Bytes,
        fin: bool,
    ) -> Result<u64, ProtocolError> {
        let end = offset + data.len() as u64;
        if end > self.max_data {
            return Err(ProtocolError::StreamFlowControl {
                stream,
                end,
                limit: self.max_data,
            });
        }
        if fin {
            self.set_final_size(stream, end)?;
        } else if let Some(known) = self.final_size
            && end > known
        {
            return Err(ProtocolError::FinalSize {
                stream,
                known,
                got: end,
            });
        }
        let grew = end.saturating_sub(self.highest);
        self.highest = self.highest.max(end);
        if self.stopped || self.reset.is_some() {
            return Ok(grew);
        }
        self.store(offset, data);
        Ok(grew)
    }

    fn store(&mut self, offset: u64, data: Bytes) {
        let end = offset + data.len() as u64;
        let mut cursor = offset.max(self.read_offset);
        // Skip what the chunk before `cursor` already covers.
        if let Some((&k, (v, _))) = self.chunks.range(..=cursor).next_back() {
            cursor = cursor.max(k + v.len() as u64);
        }
        if cursor >= end {
            return;
        }
        let later: Vec<(u64, u64)> = self
            .chunks
            .range(cursor..end)
            .map(|(&k, (v, _))| (k, k + v.len() as u64))
            .collect();
        if later.is_empty() && cursor == offset {
            // The common case: no overlap, keep the buffer as it is.
            self.buffered += data.len();
            self.chunks.insert(offset, (data, 0));
            return;
        }
        let mut put = |from: u64, to: u64, chunks: &mut BTreeMap<u64, (Bytes, usize)>| {
            if from < to {
                let piece = data.slice((from - offset) as usize..(to - offset) as usize);
                self.buffered += piece.len();
                chunks.insert(from, (piece, 0));
            }
        };
        for (k, k_end) in later {
            put(cursor, k, &mut self.chunks);
            cursor = cursor.max(k_end);
        }
        put(cursor, end, &mut self.chunks);
    }

    /// Copies in-order bytes into `out`.
    pub(crate) fn read(&mut self, out: &mut [u8]) -> ReadOutcome {
        let mut n = 0;
        while n < out.len() {
            let Some(mut entry) = self.chunks.first_entry() else {
                break;
            };
            let key = *entry.key();
            let (data, used) = entry.get_mut();
            if key + *used as u64 != self.read_offset {
                break;
            }
            let take = (data.len() - *used).min(out.len() - n);
            out[n..n + take].copy_from_slice(&data[*used..*used + take]);
            *used += take;
            n += take;
            self.read_offset += take as u64;
            self.buffered -= take;
            if *used == data.len() {
                entry.remove();
            }
        }
        if n > 0 {
            ReadOutcome::Data(n)
        } else if self.final_size == Some(self.read_offset) {
            self.done = true;
            ReadOutcome::Finished
        } else {
            ReadOutcome::Blocked
        }
    }

    /// Whether a read would return something (data, end, or reset).
    pub(crate) fn is_readable(&self) -> bool {
        self.reset.is_some()
            || self.final_size == Some(self.read_offset)
            || self
                .chunks
                .first_key_value()
                .is_some_and(|(&k, (_, used))| k + *used as u64 == self.read_offset)
    }

    /// Drops buffered bytes; returns how many (they count as consumed for
    /// connection credit).
    pub(crate) fn discard(&mut self) -> usize {
        self.chunks.clear();
        std::mem::take(&mut self.buffered)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn read_all(r: &mut RecvHalf) -> Vec<u8> {
        let mut out = Vec::new();
        let mut buf = [0u8; 333];
        while let ReadOutcome::Data(n) = r.read(&mut buf) {
            out.extend_from_slice(&buf[..n]);
        }
        out
    }

    proptest! {
        /// Whatever the writes, chunk sizes and credit, the send half hands out the bytes
        /// written, in order, each once, and the FIN with the last.
        #[test]
        fn the_send_half_hands_out_what_was_written(
            steps in proptest::collection::vec((0usize..3000, 1usize..2000), 1..60),
            limit in 1usize..5000,
        ) {
            let mut s = SendHalf::new(u64::MAX);
            let (mut written, mut out) = (Vec::new(), Vec::new());
            let mut next = 0u8;
            for (write, chunk) in steps {
                let data: Vec<u8> = (0..write).map(|_| { next = next.wrapping_add(7); next }).collect();
                let n = s.write(&data, limit);
                prop_assert!(s.unsent() <= limit);
                written.extend_from_slice(&data[..n]);
                if let Some((len, fin)) = s.next_chunk(u64::MAX, chunk) {
                    prop_assert!(len <= chunk && !fin);
                    out.extend_from_slice(s.peek(len));
                    s.advance(len, fin);
                }
            }
            s.fin_requested = true;
            while let Some((len, fin)) = s.next_chunk(u64::MAX, 1000) {
                out.extend_from_slice(s.peek(len));
                s.advance(len, fin);
                if fin {
                    break;
                }
            }
            prop_assert!(s.is_closed() && s.unsent() == 0);
            prop_assert_eq!(s.offset, written.len() as u64);
            prop_assert_eq!(out, written);
        }
    }

    #[test]
    fn overlap_and_gaps() {
        let data: Vec<u8> = (0..100u8).collect();
        let mut r = RecvHalf::new(1000);
        r.insert(0, 50, data[50..80].to_vec().into(), false)
            .unwrap();
        r.insert(0, 10, data[10..60].to_vec().into(), false)
            .unwrap();
        assert!(!r.is_readable());
        r.insert(0, 0, data[0..20].to_vec().into(), false).unwrap();
        r.insert(0, 70, data[70..100].to_vec().into(), true)
            .unwrap();
        assert_eq!(r.buffered(), 100);
        assert_eq!(read_all(&mut r), data);
        assert_eq!(r.read(&mut [0; 4]), ReadOutcome::Finished);
    }

    #[test]
    fn limits() {
        let mut r = RecvHalf::new(100);
        assert!(matches!(
            r.insert(4, 90, vec![1; 11].into(), false),
            Err(ProtocolError::StreamFlowControl { end: 101, .. })
        ));
        r.insert(4, 0, vec![1; 10].into(), true).unwrap();
        assert!(matches!(
            r.insert(4, 10, vec![1; 1].into(), false),
            Err(ProtocolError::FinalSize { .. })
        ));
        assert!(matches!(
            r.insert(4, 0, vec![1; 5].into(), true),
            Err(ProtocolError::FinalSize { .. })
        ));
        assert_eq!(r.insert(4, 0, vec![1; 10].into(), true), Ok(0));
    }

    #[test]
    fn send_half_chunks_by_credit() {
        let mut s = SendHalf::new(10);
        assert_eq!(s.write(&[7; 30], 25), 25);
        assert_eq!(s.next_chunk(100, 8), Some((8, false)));
        s.advance(8, false);
        assert_eq!(s.next_chunk(100, 8), Some((2, false)));
        s.advance(2, false);
        assert_eq!(s.next_chunk(100, 8), None);
        assert!(s.blocked_on_stream_credit());
        s.max_data = 100;
        s.fin_requested = true;
        assert_eq!(s.next_chunk(3, 100), Some((3, false)));
        assert_eq!(s.next_chunk(100, 100), Some((15, true)));
    }

    proptest! {
        /// Any order of overlapping, duplicated chunks reassembles to the
        /// original bytes, and buffered memory never exceeds the data size.
        #[test]
        fn reassembles_any_order(
            len in 1usize..3000,
            cuts in proptest::collection::vec((0usize..3000, 1usize..400), 1..60),
            seed in any::<u64>(),
        ) {
            let data: Vec<u8> = (0..len).map(|i| (i * 31 + 7) as u8).collect();
            let mut pieces: Vec<(usize, usize)> = cuts
                .into_iter()
                .map(|(a, l)| (a % len, l))
                .map(|(a, l)| (a, (a + l).min(len)))
                .collect();
            // Make sure the pieces cover everything.
            let mut at = 0;
            while at < len {
                pieces.push((at, (at + 256).min(len)));
                at += 256;
            }
            let mut rng = seed;
            for i in (1..pieces.len()).rev() {
                rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                pieces.swap(i, (rng >> 33) as usize % (i + 1));
            }
            let mut r = RecvHalf::new(len as u64);
            let mut out = Vec::new();
            let mut buf = [0u8; 100];
            for (a, b) in pieces {
                r.insert(0, a as u64, data[a..b].to_vec().into(), b == len).unwrap();
                prop_assert!(r.buffered() <= len);
                if rng & 1 == 0 {
                    while let ReadOutcome::Data(n) = r.read(&mut buf) {
                        out.extend_from_slice(&buf[..n]);
                    }
                }
            }
            out.extend(read_all(&mut r));
            prop_assert_eq!(out, data);
            prop_assert_eq!(r.read(&mut buf), ReadOutcome::Finished);
            prop_assert_eq!(r.buffered(), 0);
        }
    }
}
