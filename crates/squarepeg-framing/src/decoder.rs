//! In-order decoding: the receive side over a plain TCP byte stream, where
//! bytes arrive in sequence from stream offset 0 (Minion §5.2, "Reception"
//! without uTCP).
//!
//! This is the hot path of every kernel-TCP connection, so it is built to
//! touch each byte as few times as possible and to allocate per read, not
//! per frame:
//!
//! - the caller reads straight into the decoder's buffer
//!   ([`StreamDecoder::unfilled`], [`StreamDecoder::filled`]); only the
//!   partial frame at the end of a read is moved, to the buffer's front;
//! - one `memchr` pass finds the markers;
//! - the frames of one read are COBS-decoded, one after the other, into
//!   one output chunk, each checksummed right after its decoding while it
//!   is in cache; every payload is a [`Bytes`] slice of that chunk;
//! - chunks come from a pool and go back to it when the last payload
//!   slicing them is dropped, so a steady stream allocates nothing.
//!
//! # Memory
//!
//! The decoder holds at most one partial frame (at most the encoding of a
//! `max_body` frame) plus one read. Payload slices keep their chunk alive,
//! so a few long-lived small payloads could pin many chunks; the decoder
//! therefore counts the chunks still referenced, and while they would
//! exceed the configured pinning limit it copies each payload into its own
//! allocation instead (memory then follows the payload bytes, which the
//! session bounds). It does the same for reads too small to be worth a
//! chunk (interactive traffic).

use std::collections::VecDeque;
use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;

use crate::frame::{Frame, decode_run_to_slice};
use crate::{FrameError, FrameHeader, cobs};

/// Default bytes offered per read ([`StreamDecoder::unfilled`]).
pub const DEFAULT_READ_SIZE: usize = 64 * 1024;

/// Default bound on the bytes of output chunks kept alive by payloads.
pub const DEFAULT_PINNED_LIMIT: usize = 16 << 20;

/// Idle chunks kept for reuse: enough to cover a receive queue of a few
/// MiB that the application drains in bursts (each chunk freed and then
/// allocated again costs a page-fault or memset pass over it). An idle
/// connection gives them back ([`StreamDecoder::release_idle`]).
const POOL_KEEP: usize = 32;

/// The bytes of a frame in progress that [`StreamDecoder::release_idle`] (and the plain
/// decoder's) moves to a buffer of their own size; a longer partial frame keeps its buffer.
pub const IDLE_KEEP: usize = 4096;

/// Splits an in-order byte stream into frames.
///
/// The stream must begin with a marker; bytes before the first marker are
/// reported once as [`FrameError::GarbageBeforeMarker`] and skipped. Runs of
/// zero bytes are empty frames and are skipped. A run longer than any
/// `max_body` frame's encoding is reported once as
/// [`FrameError::Oversize`] and its bytes dropped up to the next marker.
/// Frames are decoded when their bytes arrive and wait in a queue for
/// [`StreamDecoder::next_frame`]: drain it after each push.
#[derive(Debug)]
pub struct StreamDecoder {
    max_body: usize,
    max_encoded: usize,
    read_size: usize,
    /// Received bytes: `buf[start..filled]` is not yet handled. Always
    /// initialised up to its length, so reads can go into it directly.
    buf: Vec<u8>,
    start: usize,
    filled: usize,
    /// Where the marker scan resumes inside the partial frame.
    scanned: usize,
    mode: Mode,
    /// The complete runs and errors of the latest bytes, in stream order.
    found: Vec<Found>,
    /// Where each decoded frame of a chunk lies in it (reused per read).
    spans: Vec<Result<(FrameHeader, Range<usize>), FrameError>>,
    ready: VecDeque<Result<Frame, FrameError>>,
    /// Scratch output for frames copied out instead of sliced.
    scratch: Vec<u8>,
    pool: Arc<ChunkPool>,
    pinned_limit: usize,
    offset: u64,
    /// Stop at a Switch frame to another format ([`StreamDecoder::stop_at_switch`]).
    stop_at_switch: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// Nothing received yet: the first byte must be a marker.
    Start,
    /// `buf[start]` is the leading marker of a frame not yet complete.
    Frame,
    /// Dropping bytes up to the next marker (garbage before the first
    /// marker, or the rest of an oversize frame).
    Skip,
    /// After a Switch frame to another format: `buf[start..filled]` is not
    /// uCOBS and waits for [`StreamDecoder::take_rest`].
    Stopped,
}

#[derive(Clone, Copy, Debug)]
enum Found {
    /// A frame's encoding, `buf[start..end]` (between its markers).
    Run(usize, usize),
    Error(FrameError),
}

impl StreamDecoder {
    /// A decoder that rejects frames whose body exceeds `max_body` bytes,
    /// with the default read size and pinning limit.
    pub fn new(max_body: usize) -> Self {
        Self::with_buffers(max_body, DEFAULT_READ_SIZE, DEFAULT_PINNED_LIMIT)
    }

    /// A decoder offering `read_size` bytes per read and keeping at most
    /// about `pinned_limit` bytes of output chunks alive through payloads
    /// (see the module docs).
    pub fn with_buffers(max_body: usize, read_size: usize, pinned_limit: usize) -> Self {
        let read_size = read_size.max(1024);
        Self {
            max_body,
            max_encoded: cobs::max_encoded_len(max_body),
            read_size,
            buf: Vec::new(),
            start: 0,
            filled: 0,
            scanned: 0,
            mode: Mode::Start,
            found: Vec::new(),
            spans: Vec::new(),
            ready: VecDeque::new(),
            scratch: Vec::new(),
            // A read's frames plus the window slack of the last one, with
            // some room for a frame carried over from the last read (a
            // longer batch gets a buffer of its own).
            pool: ChunkPool::new(read_size + read_size / 4 + cobs::WINDOW),
            pinned_limit,
            offset: 0,
            stop_at_switch: false,
        }
    }

    /// With `on`, the decoder stops after a Switch frame to plain frames
    /// (docs/wire.md §3): the frames before it and the Switch frame itself
    /// come out of [`StreamDecoder::next_frame`], and the bytes after its
    /// closing marker wait for [`StreamDecoder::take_rest`] (see
    /// [`crate::FrameReader`]). Off (the default), a Switch frame is just a
    /// frame.
    pub fn stop_at_switch(&mut self, on: bool) {
        self.stop_at_switch = on;
    }

    pub(crate) fn pool(&self) -> Arc<ChunkPool> {
        self.pool.clone()
    }

    /// Whether the decoder stopped at a Switch frame.
    pub fn is_stopped(&self) -> bool {
        self.mode == Mode::Stopped
    }

    /// After a stop at a Switch frame: the bytes received after it (empty
    /// otherwise). Later bytes pushed into a stopped decoder are held for
    /// this too.
    pub fn take_rest(&mut self) -> Vec<u8> {
        if self.mode != Mode::Stopped {
            return Vec::new();
        }
        let rest = self.buf[self.start..self.filled].to_vec();
        self.start = self.filled;
        self.scanned = self.filled;
        rest
    }

    /// Room to read into: at least the read size. Bytes written at its
    /// front count once [`StreamDecoder::filled`] is called.
    pub fn unfilled(&mut self) -> &mut [u8] {
        if self.buf.len() - self.filled < self.read_size {
            // Move the partial frame to the front; grow only if it is
            // long (a large frame arriving in several reads).
            if self.start > 0 {
                self.buf.copy_within(self.start..self.filled, 0);
                self.filled -= self.start;
                self.scanned -= self.start;
                self.start = 0;
            }
            if self.buf.len() < self.filled + self.read_size {
                self.buf.resize(self.filled + self.read_size, 0);
            }
        }
        &mut self.buf[self.filled..]
    }

    /// Takes `n` bytes written at the front of [`StreamDecoder::unfilled`]
    /// as the stream's next bytes, and decodes the frames they complete.
    pub fn filled(&mut self, n: usize) {
        let n = n.min(self.buf.len() - self.filled);
        self.filled += n;
        self.offset += n as u64;
        self.scan();
        self.decode_found();
    }

    /// Appends received bytes (a copy; see [`StreamDecoder::unfilled`] to
    /// read into the decoder directly).
    pub fn push(&mut self, data: &[u8]) {
        Fill::push_bytes(self, data);
    }

    /// Returns the next complete frame, `None` if more bytes are needed, or
    /// an error for bytes that cannot be a frame. After an error the decoder
    /// has skipped the offending bytes, but a caller on a reliable stream
    /// should treat it as a protocol violation by the peer.
    pub fn next_frame(&mut self) -> Option<Result<Frame, FrameError>> {
        self.ready.pop_front()
    }

    /// Frames (and errors) decoded and waiting for
    /// [`StreamDecoder::next_frame`].
    pub fn ready_len(&self) -> usize {
        self.ready.len()
    }

    /// Bytes held waiting for the end of a frame.
    pub fn buffered(&self) -> usize {
        match self.mode {
            Mode::Frame => self.filled - self.start - 1,
            _ => 0,
        }
    }

    /// Stream offset of the next byte to push (the bytes pushed so far).
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Bytes of output chunks kept alive by payloads now.
    pub fn pinned_bytes(&self) -> usize {
        self.pool.live()
    }

    /// Bytes of memory this decoder holds for its next reads and frames: its read buffer,
    /// its scratch space and the idle chunks of its pool (not the chunks payloads keep).
    pub fn buffer_capacity(&self) -> usize {
        self.buf.capacity() + self.scratch.capacity() + self.pool.free_bytes()
    }

    /// Gives back the memory an idle connection need not hold: the read buffer (the bytes of
    /// a frame in progress, at most [`IDLE_KEEP`], move to one of their size; more stay
    /// where they are), the scratch space and the pool's idle chunks. The next read
    /// allocates again; nothing received is lost.
    pub fn release_idle(&mut self) {
        if self.filled - self.start <= IDLE_KEEP {
            self.buf = self.buf[self.start..self.filled].to_vec();
            self.filled -= self.start;
            self.scanned = self.scanned.saturating_sub(self.start);
            self.start = 0;
        }
        self.scratch = Vec::new();
        self.found = Vec::new();
        self.spans = Vec::new();
        if self.ready.is_empty() {
            self.ready = VecDeque::new();
        }
        self.pool.trim();
    }

    /// Finds the complete runs in `buf[start..filled]`.
    fn scan(&mut self) {
        loop {
            match self.mode {
                Mode::Stopped => return,
                Mode::Start => {
                    if self.start == self.filled {
                        return;
                    }
                    if self.buf[self.start] == 0 {
                        self.mode = Mode::Frame;
                        self.scanned = self.start + 1;
                    } else {
                        let first = &self.buf[self.start..self.filled];
                        self.found
                            .push(Found::Error(FrameError::before_first_marker(first)));
                        self.mode = Mode::Skip;
                    }
                }
                Mode::Skip => match memchr::memchr(0, &self.buf[self.start..self.filled]) {
                    Some(z) => {
                        self.start += z;
                        self.scanned = self.start + 1;
                        self.mode = Mode::Frame;
                    }
                    None => {
                        self.start = self.filled;
                        self.scanned = self.filled;
                        return;
                    }
                },
                Mode::Frame => {
                    let Some(k) = memchr::memchr(0, &self.buf[self.scanned..self.filled]) else {
                        self.scanned = self.filled;
                        let len = self.filled - self.start - 1;
                        if len > self.max_encoded {
                            // Given up on before its end: its size is not known.
                            self.found.push(Found::Error(FrameError::Oversize {
                                len: None,
                                limit: self.max_body,
                            }));
                            self.mode = Mode::Skip;
                            self.start = self.filled;
                        }
                        return;
                    };
                    let end = self.scanned + k;
                    if end > self.start + 1 {
                        let run = (self.start + 1, end);
                        self.found.push(Found::Run(run.0, run.1));
                        if self.stop_at_switch && self.is_switch_to_plain(run.0, run.1) {
                            self.mode = Mode::Stopped;
                            self.start = end + 1;
                            self.scanned = end + 1;
                            return;
                        }
                    }
                    self.start = end;
                    self.scanned = end + 1;
                }
            }
        }
    }

    /// Whether the run `buf[a..b]` is a valid Switch frame to plain frames
    /// (a Switch to a format this build does not read is left to the
    /// session, which rejects it). The first body byte of a Switch frame (version and kind)
    /// is checked first, so other frames cost one compare.
    fn is_switch_to_plain(&self, a: usize, b: usize) -> bool {
        const SWITCH_BYTE0: u8 = (crate::VERSION << 4) | crate::FrameKind::Switch as u8;
        let run = &self.buf[a..b];
        run.len() >= 2
            && run[0] >= 2
            && run[1] == SWITCH_BYTE0
            && matches!(
                crate::frame::decode_run(run, self.max_body),
                Ok(Frame { header: FrameHeader::Switch { format }, .. })
                    if crate::FrameFormat::from_id(format) == Some(crate::FrameFormat::Plain)
            )
    }

    /// Decodes the runs found, into one pooled chunk if they are worth it
    /// and the pinning limit allows, else each into its own allocation.
    fn decode_found(&mut self) {
        if self.found.is_empty() {
            return;
        }
        let total: usize = self
            .found
            .iter()
            .map(|f| match *f {
                Found::Run(a, b) => b - a,
                Found::Error(_) => 0,
            })
            .sum();
        let size = self.pool.chunk_len(total + cobs::WINDOW);
        let worth_a_chunk = total >= self.pool.chunk_size / 8;
        if worth_a_chunk && self.pinned_bytes() + size <= self.pinned_limit {
            self.decode_into_chunk(total);
        } else {
            self.decode_each();
        }
        self.found.clear();
    }

    fn decode_into_chunk(&mut self, total: usize) {
        let mut out = self.pool.get(total + cobs::WINDOW);
        let mut o = 0;
        for f in &self.found {
            self.spans.push(match *f {
                Found::Run(a, b) => {
                    match decode_run_to_slice(&self.buf[a..b], self.max_body, &mut out[o..]) {
                        Ok((header, payload)) => {
                            let span = (header, o + payload.start..o + payload.end);
                            o += payload.end;
                            Ok(span)
                        }
                        Err(e) => Err(e),
                    }
                }
                Found::Error(e) => Err(e),
            });
        }
        let chunk = self.pool.share(out);
        for span in self.spans.drain(..) {
            self.ready.push_back(span.map(|(header, range)| Frame {
                header,
                payload: chunk.slice(range),
            }));
        }
    }

    fn decode_each(&mut self) {
        for f in &self.found {
            let frame = match *f {
                Found::Run(a, b) => {
                    let need = b - a + cobs::WINDOW;
                    if self.scratch.len() < need {
                        self.scratch.resize(need, 0);
                    }
                    decode_run_to_slice(&self.buf[a..b], self.max_body, &mut self.scratch).map(
                        |(header, range)| Frame {
                            header,
                            payload: Bytes::copy_from_slice(&self.scratch[range]),
                        },
                    )
                }
                Found::Error(e) => Err(e),
            };
            self.ready.push_back(frame);
        }
        // Keep the scratch buffer small once a large frame has passed.
        if self.scratch.len() > self.read_size + cobs::WINDOW {
            self.scratch = Vec::new();
        }
    }
}

/// A receiver read into in place: room to read into, then how much was read.
pub(crate) trait Fill {
    fn room(&mut self) -> &mut [u8];
    fn take(&mut self, n: usize);

    /// Copies `data` in through the room, as reads would.
    fn push_bytes(&mut self, mut data: &[u8]) {
        while !data.is_empty() {
            let room = self.room();
            let n = room.len().min(data.len());
            room[..n].copy_from_slice(&data[..n]);
            self.take(n);
            data = &data[n..];
        }
    }
}

impl Fill for StreamDecoder {
    fn room(&mut self) -> &mut [u8] {
        self.unfilled()
    }
    fn take(&mut self, n: usize) {
        self.filled(n);
    }
}

/// Output chunks not in use, and a count of those in use.
#[derive(Debug)]
pub(crate) struct ChunkPool {
    free: Mutex<Vec<Vec<u8>>>,
    /// Bytes of the chunks alive through payload slices.
    live: AtomicUsize,
    pub(crate) chunk_size: usize,
}

impl ChunkPool {
    pub(crate) fn new(chunk_size: usize) -> Arc<Self> {
        Arc::new(Self {
            free: Mutex::new(Vec::new()),
            live: AtomicUsize::new(0),
            chunk_size,
        })
    }

    /// Bytes of the chunks alive through payload slices.
    pub(crate) fn live(&self) -> usize {
        self.live.load(Ordering::Relaxed)
    }

    /// An initialised buffer of at least `len` bytes (a pooled one if `len`
    /// fits the pooled size), not yet counted as live.
    pub(crate) fn get(&self, len: usize) -> Vec<u8> {
        let len = self.chunk_len(len);
        if len == self.chunk_size {
            let reused = self.free.lock().unwrap_or_else(|e| e.into_inner()).pop();
            reused.unwrap_or_else(|| vec![0; len])
        } else {
            vec![0; len]
        }
    }

    /// Shares `buf` as [`Bytes`] to slice payloads from, counted as live
    /// until the last slice is dropped, then returned to the pool.
    pub(crate) fn share(self: &Arc<Self>, buf: Vec<u8>) -> Bytes {
        self.live.fetch_add(buf.len(), Ordering::Relaxed);
        Bytes::from_owner(Chunk {
            buf,
            pool: self.clone(),
        })
    }

    /// The size of the chunk that holds `len` bytes: the pooled size, or
    /// for a frame larger than that, a buffer of its own.
    pub(crate) fn chunk_len(&self, len: usize) -> usize {
        len.max(self.chunk_size)
    }

    /// Bytes of the idle chunks kept for reuse.
    pub(crate) fn free_bytes(&self) -> usize {
        self.free
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(Vec::capacity)
            .sum()
    }

    /// Frees the idle chunks (chunks payloads keep come back to it later as usual).
    pub(crate) fn trim(&self) {
        self.free.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }

    fn give_back(&self, buf: Vec<u8>) {
        self.live.fetch_sub(buf.len(), Ordering::Relaxed);
        if buf.len() == self.chunk_size {
            let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
            if free.len() < POOL_KEEP {
                free.push(buf);
            }
        }
    }
}

/// The owner of a chunk's bytes behind the payload slices; returns the
/// buffer to the pool when the last slice goes.
struct Chunk {
    buf: Vec<u8>,
    pool: Arc<ChunkPool>,
}

impl AsRef<[u8]> for Chunk {
    fn as_ref(&self) -> &[u8] {
        &self.buf
    }
}

impl Drop for Chunk {
    fn drop(&mut self) {
        self.pool.give_back(std::mem::take(&mut self.buf));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{encode_frame, encode_padding};

    fn frames(n: u64) -> Vec<Frame> {
        (0..n)
            .map(|i| Frame {
                header: FrameHeader::Message {
                    substream: i % 3,
                    number: i,
                },
                payload: vec![i as u8; i as usize * 37].into(),
            })
            .collect()
    }

    /// After a burst whose payloads shared pooled chunks, an idle decoder gives back its
    /// read buffer, scratch space and idle chunks once the payloads are dropped, and decodes
    /// the next frames as before.
    #[test]
    fn an_idle_decoder_gives_its_memory_back() {
        let sent = frames(200);
        let mut wire = Vec::new();
        for f in &sent {
            encode_frame(&f.header, &f.payload, &mut wire).unwrap();
        }
        let mut d = StreamDecoder::new(1 << 20);
        d.push(&wire);
        let got: Vec<Frame> = std::iter::from_fn(|| d.next_frame())
            .map(Result::unwrap)
            .collect();
        assert_eq!(got, sent);
        assert!(d.pinned_bytes() > 0, "payloads are slices of pooled chunks");
        drop(got);
        assert!(d.buffer_capacity() > 64 * 1024);
        d.release_idle();
        // The last frame's closing marker, which opens the next frame, stays.
        assert_eq!(d.buffer_capacity(), 1);
        let mut more = Vec::new();
        encode_frame(&sent[7].header, &sent[7].payload, &mut more).unwrap();
        d.push(&more[1..]);
        assert_eq!(d.next_frame(), Some(Ok(sent[7].clone())));
    }

    #[test]
    fn byte_by_byte() {
        let mut wire = Vec::new();
        let frames = frames(20);
        for f in &frames {
            encode_frame(&f.header, &f.payload, &mut wire).unwrap();
        }
        let mut d = StreamDecoder::new(1 << 16);
        let mut got = Vec::new();
        for b in &wire {
            d.push(std::slice::from_ref(b));
            while let Some(f) = d.next_frame() {
                got.push(f.unwrap());
            }
        }
        assert_eq!(got, frames);
        assert_eq!(d.buffered(), 0);
        assert_eq!(d.offset(), wire.len() as u64);
    }

    #[test]
    fn whole_reads_share_a_pooled_chunk() {
        let mut wire = Vec::new();
        let frames: Vec<Frame> = (0..200u64)
            .map(|i| Frame {
                header: FrameHeader::Message {
                    substream: 0,
                    number: i,
                },
                payload: vec![(i % 7) as u8; 1000].into(),
            })
            .collect();
        for f in &frames {
            encode_frame(&f.header, &f.payload, &mut wire).unwrap();
        }
        let mut d = StreamDecoder::with_buffers(1 << 16, 64 * 1024, 1 << 20);
        let mut got = Vec::new();
        for piece in wire.chunks(50_000) {
            d.push(piece);
            while let Some(f) = d.next_frame() {
                got.push(f.unwrap());
            }
        }
        assert_eq!(got, frames);
        assert!(d.pinned_bytes() > 0);
        drop(got);
        assert_eq!(d.pinned_bytes(), 0);
        assert!(!d.pool.free.lock().unwrap().is_empty());
    }

    #[test]
    fn pinned_limit_switches_to_copies() {
        let mut wire = Vec::new();
        for i in 0..2000u64 {
            let h = FrameHeader::Message {
                substream: 0,
                number: i,
            };
            encode_frame(&h, &[1u8; 500], &mut wire).unwrap();
        }
        // Room for two chunks only: the payloads held here pin them, and
        // later reads must be copied out.
        let mut d = StreamDecoder::with_buffers(1 << 16, 16 * 1024, 2 * (32 * 1024 + 64));
        let mut held = Vec::new();
        for piece in wire.chunks(16 * 1024) {
            d.push(piece);
            while let Some(f) = d.next_frame() {
                held.push(f.unwrap());
            }
            assert!(d.pinned_bytes() <= 2 * (32 * 1024 + 64));
        }
        assert_eq!(held.len(), 2000);
        assert!(held.iter().all(|f| f.payload[..] == [1u8; 500]));
    }

    #[test]
    fn a_tls_record_before_the_first_marker_is_named() {
        // A ClientHello's record header (RFC 8446 §5.1), an alert's, and anything else.
        for (first, want) in [
            (&[0x16, 0x03, 0x01, 0x02, 0x00][..], FrameError::TlsRecord),
            (&[0x15, 0x03, 0x03, 0x00, 0x02][..], FrameError::TlsRecord),
            (&[0x16][..], FrameError::TlsRecord),
            (&[0x16, 0x04][..], FrameError::GarbageBeforeMarker),
            (&b"GET / HTTP/1.1"[..], FrameError::GarbageBeforeMarker),
        ] {
            let mut d = StreamDecoder::new(1024);
            d.push(first);
            assert_eq!(d.next_frame(), Some(Err(want)), "{first:?}");
        }
    }

    #[test]
    fn garbage_and_oversize() {
        let mut d = StreamDecoder::new(16);
        d.push(b"xx\0");
        assert_eq!(d.next_frame(), Some(Err(FrameError::GarbageBeforeMarker)));
        assert_eq!(d.next_frame(), None);
        d.push(&[7u8; 40]);
        // Given up on after 40 encoded bytes: the frame's size is not known, and the 40 bytes
        // seen are not reported as its size.
        let e = d.next_frame().unwrap().unwrap_err();
        assert_eq!(
            e,
            FrameError::Oversize {
                len: None,
                limit: 16
            }
        );
        assert_eq!(e.to_string(), "frame exceeds the limit of 16 bytes");
        // The rest of the oversize frame is skipped silently, and nothing
        // of it is held.
        d.push(&[7u8; 4000]);
        assert_eq!(d.next_frame(), None);
        assert_eq!(d.buffered(), 0);
        let mut wire = Vec::new();
        encode_padding(12, &mut wire);
        d.push(&wire);
        assert!(matches!(
            d.next_frame(),
            Some(Ok(Frame {
                header: FrameHeader::Padding,
                ..
            }))
        ));
        assert_eq!(d.next_frame(), None);
    }

    #[test]
    fn bad_frames_do_not_block_later_ones() {
        let mut wire = Vec::new();
        encode_frame(&FrameHeader::Control, b"one", &mut wire).unwrap();
        let bad_at = wire.len() + 4; // the payload's first byte
        encode_frame(&FrameHeader::Control, b"two", &mut wire).unwrap();
        encode_frame(&FrameHeader::Control, b"three", &mut wire).unwrap();
        wire[bad_at] ^= 0x20;
        let mut d = StreamDecoder::new(100);
        d.push(&wire);
        assert_eq!(d.next_frame().unwrap().unwrap().payload, &b"one"[..]);
        assert!(matches!(
            d.next_frame(),
            Some(Err(FrameError::ChecksumMismatch { .. }))
        ));
        assert_eq!(d.next_frame().unwrap().unwrap().payload, &b"three"[..]);
        assert_eq!(d.next_frame(), None);
    }

    #[test]
    fn large_frames_across_many_reads() {
        let big = Frame {
            header: FrameHeader::Message {
                substream: 1,
                number: 9,
            },
            payload: crate::sample::payload(crate::sample::PayloadKind::Random, 300_000, 5).into(),
        };
        let mut wire = Vec::new();
        for _ in 0..3 {
            encode_frame(&big.header, &big.payload, &mut wire).unwrap();
        }
        let mut d = StreamDecoder::with_buffers(1 << 20, 4096, 1 << 20);
        let mut got = Vec::new();
        for piece in wire.chunks(3000) {
            d.push(piece);
            assert!(d.buffered() <= cobs::max_encoded_len(1 << 20));
            while let Some(f) = d.next_frame() {
                got.push(f.unwrap());
            }
        }
        assert_eq!(got, vec![big.clone(), big.clone(), big]);
    }

    proptest::proptest! {
        /// On any bytes (noise, valid frames, damaged frames), cut into
        /// any pieces, with limits that force both output paths: the same
        /// reports as the reassembler, in the same order, and never more
        /// than one frame held.
        #[test]
        fn any_bytes_like_the_reassembler(
            frames in proptest::collection::vec(
                (0u64..5, proptest::collection::vec(proptest::prelude::any::<u8>(), 0..300)),
                0..12,
            ),
            noise in proptest::collection::vec(
                proptest::prop_oneof![proptest::prelude::Just(0u8), proptest::prelude::any::<u8>()],
                0..300,
            ),
            noise_at in 0usize..4000,
            flips in proptest::collection::vec((0usize..4000, 1u8..=255), 0..3),
            cut in 1usize..600,
            max_body in proptest::prop_oneof![proptest::prelude::Just(200usize), proptest::prelude::Just(1 << 16)],
        ) {
            let mut wire = Vec::new();
            for (n, payload) in &frames {
                let h = FrameHeader::Message { substream: 0, number: *n };
                encode_frame(&h, payload, &mut wire).unwrap();
            }
            let at = noise_at.min(wire.len());
            wire.splice(at..at, noise);
            for (i, x) in flips {
                if let Some(b) = wire.get_mut(i) {
                    *b ^= x;
                }
            }
            let norm = |r: Result<Frame, FrameError>| match r {
                Err(FrameError::Oversize { limit, .. }) => Err(FrameError::Oversize { len: None, limit }),
                other => other,
            };
            let mut d = StreamDecoder::with_buffers(max_body, 1024, 4096);
            let mut r = crate::Reassembler::new(max_body, crate::Reassembler::min_limit(max_body)).unwrap();
            let mut off = 0u64;
            for piece in wire.chunks(cut) {
                d.push(piece);
                r.insert(off, piece).unwrap();
                off += piece.len() as u64;
                while let Some(f) = d.next_frame() {
                    let g = r.next_frame().map(|g| g.map(|g| g.frame).map_err(|e| e.error));
                    proptest::prop_assert_eq!(Some(norm(f)), g.map(norm));
                }
                proptest::prop_assert!(r.next_frame().is_none());
                proptest::prop_assert!(d.buffered() <= cobs::max_encoded_len(max_body));
            }
        }
    }

    /// Mirrors the reassembler: the same frames and errors, in the same
    /// order, for any cut of a stream of valid and damaged frames. (An
    /// oversize run is reported as soon as it is too long, so its length
    /// in the report depends on where reads end: only the kind is compared.)
    #[test]
    fn agrees_with_the_reassembler() {
        let norm = |r: Result<Frame, FrameError>| match r {
            Err(FrameError::Oversize { limit, .. }) => {
                Err(FrameError::Oversize { len: None, limit })
            }
            other => other,
        };
        let mut wire = Vec::new();
        for (i, f) in frames(40).iter().enumerate() {
            encode_frame(&f.header, &f.payload, &mut wire).unwrap();
            if i % 7 == 3 {
                let at = wire.len() - 3;
                wire[at] ^= 0x11;
            }
        }
        for cut in [1usize, 2, 7, 100, 1000, 100_000] {
            let mut d = StreamDecoder::with_buffers(600, 1024, 1 << 20);
            let mut r = crate::Reassembler::new(600, 1 << 20).unwrap();
            let (mut a, mut b) = (Vec::new(), Vec::new());
            let mut off = 0u64;
            for piece in wire.chunks(cut) {
                d.push(piece);
                r.insert(off, piece).unwrap();
                off += piece.len() as u64;
                while let Some(f) = d.next_frame() {
                    a.push(norm(f));
                }
                while let Some(f) = r.next_frame() {
                    b.push(norm(f.map(|f| f.frame).map_err(|e| e.error)));
                }
            }
            assert!(a == b, "cut {cut}: the decoders disagree");
            assert_eq!(a.len(), 40);
        }
    }
}
