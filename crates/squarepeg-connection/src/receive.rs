//! The receive side: bytes or segments from the substrate, through the record layer (see
//! `record`) and the frame codec, into the session.

use std::time::Instant;

use squarepeg_framing::{
    Decoded, Frame, FrameError, FrameHeader, FrameReader, ReassembledFrame, Reassembler,
    ReassemblyError,
};
use squarepeg_session::control::ControlFrame;
use squarepeg_session::{MAX_FRAME_BODY, Session};

use crate::UtcpStats;

/// The in-order receive path's frame reader: the substrate's bytes go straight into its
/// buffer ([`Receiver::buffer`], [`Receiver::filled`]) and come out as frames whose payloads
/// are slices of pooled chunks — uCOBS frames, and plain frames after the peer's switch
/// (docs/wire.md §3).
///
/// A driver that wants to read and decode without holding whatever guards the connection
/// (the tokio driver shares the connection with the application's handles behind a lock)
/// borrows it with [`crate::Connection::take_receiver`], reads into it, and gives it back
/// with [`crate::Connection::return_receiver`], which hands the decoded frames to the
/// session.
#[derive(Debug)]
pub struct Receiver {
    decoder: FrameReader,
}

impl Receiver {
    pub(crate) fn new(read_buffer: usize, pinned_limit: usize, accept_plain: bool) -> Self {
        let mut decoder = FrameReader::with_buffers(MAX_FRAME_BODY, read_buffer, pinned_limit);
        decoder.accept_plain(accept_plain);
        Self { decoder }
    }

    /// Reads plain frames from the first byte (inside TLS records, docs/wire.md §4).
    pub(crate) fn start_plain(&mut self) {
        self.decoder.start_plain();
    }

    /// Where the next bytes of the stream go (read into it, then call [`Self::filled`]).
    pub fn buffer(&mut self) -> &mut [u8] {
        self.decoder.unfilled()
    }

    /// `n` bytes were written into [`Self::buffer`]: decodes the frames they complete.
    pub fn filled(&mut self, n: usize) {
        self.decoder.filled(n);
    }

    /// Copies `data` in and decodes the frames it completes.
    pub fn push(&mut self, data: &[u8]) {
        self.decoder.push(data);
    }

    /// Bytes received so far.
    pub fn offset(&self) -> u64 {
        self.decoder.offset()
    }

    /// See [`FrameReader::release_idle`].
    pub fn release_idle(&mut self) {
        self.decoder.release_idle();
    }

    /// See [`FrameReader::buffer_capacity`].
    pub fn buffer_capacity(&self) -> usize {
        self.decoder.buffer_capacity()
    }

    pub(crate) fn next_frame(&mut self) -> Option<Result<Frame, FrameError>> {
        self.decoder.next_frame()
    }

    /// [`Self::next_frame`], with consecutive plain MESSAGE frames as one run.
    pub(crate) fn next_decoded(&mut self) -> Option<Decoded> {
        self.decoder.next_decoded()
    }

    /// Stream offset just past the last whole frame, once every decoded frame was taken
    /// ([`Self::next_frame`] returned `None`).
    pub(crate) fn frames_end(&self) -> u64 {
        self.decoder.offset() - self.decoder.buffered() as u64
    }
}

/// The unordered receive path (Minion §4.1, §5.2): segments at their stream offsets into
/// the reassembler, every frame to the session as soon as it is complete.
#[derive(Debug)]
pub(crate) struct SegmentReceiver {
    reassembler: Reassembler,
    /// The peer's CLOSE, held until the stream before it is complete.
    held_close: Option<ReassembledFrame>,
}

impl SegmentReceiver {
    /// `window` is the transport's receive buffer: the reassembler holds that much plus one
    /// maximal frame, so that no segment the transport accepts is refused.
    pub(crate) fn new(window: usize) -> Result<Self, ReassemblyError> {
        let limit = window + Reassembler::min_limit(MAX_FRAME_BODY);
        Ok(Self {
            reassembler: Reassembler::new(MAX_FRAME_BODY, limit)?,
            held_close: None,
        })
    }

    pub(crate) fn handle_segment(
        &mut self,
        now: Instant,
        session: &mut Session,
        stats: &mut UtcpStats,
        offset: u64,
        data: &[u8],
    ) {
        stats.segments_read += 1;
        stats.bytes_read += data.len() as u64;
        if let Err(e) = self.reassembler.insert(offset, data) {
            tracing::debug!("segment refused: {e}");
            stats.segments_refused += 1;
        }
        while let Some(frame) = self.reassembler.next_frame() {
            match frame {
                Ok(f) if is_close(&f.frame) => self.held_close = Some(f),
                Ok(f) => session.handle_frame(now, f.frame),
                Err(rejected) => {
                    // A mix of two transmissions, or a middlebox's doing: over an unordered
                    // substrate not the peer's fault (Hollywood §4.5).
                    tracing::debug!("{rejected}");
                    stats.frames_rejected += 1;
                }
            }
        }
        // The peer's CLOSE ends the session, so it is taken only once everything sent
        // before it has arrived: it must not overtake frames still being retransmitted.
        if self
            .held_close
            .as_ref()
            .is_some_and(|f| self.reassembler.in_order_offset() > f.offset)
            && let Some(f) = self.held_close.take()
        {
            session.handle_frame(now, f.frame);
        }
    }
}

/// Whether `frame` is a CLOSE or APPLICATION_CLOSE.
fn is_close(frame: &Frame) -> bool {
    frame.header == FrameHeader::Control
        && matches!(
            ControlFrame::decode(&frame.payload),
            Ok(ControlFrame::Close { .. } | ControlFrame::ApplicationClose { .. })
        )
}

/// The receive path of TLS over segments (Minion §6): the record layer finds and opens
/// records ahead of holes (`squarepeg_tls::Tls::push_segment`); in-order plaintext goes
/// through a plain-frame reader, each record delivered out of order holds whole frames
/// (docs/wire.md §5) and is decoded on its own.
#[derive(Debug)]
pub(crate) struct TlsSegmentReceiver {
    /// Plaintext of the in-order stream.
    pub(crate) in_order: Receiver,
    /// Decodes one out-of-order record's frames at a time (empty between records).
    record_frames: FrameReader,
    /// The peer's CLOSE from a record delivered out of order, with the record's offset:
    /// held until the stream before it is complete.
    held_close: Option<(u64, Frame)>,
    /// Out-of-order records of the last segment: (offset, content).
    pub(crate) records: Vec<(u64, Vec<u8>)>,
    /// The in-order reader's sizes, to start it afresh.
    read_buffer: usize,
    pinned_limit: usize,
}

impl TlsSegmentReceiver {
    pub(crate) fn new(read_buffer: usize, pinned_limit: usize) -> Self {
        let mut in_order = Receiver::new(read_buffer, pinned_limit, true);
        in_order.start_plain();
        let mut record_frames = FrameReader::new(MAX_FRAME_BODY);
        record_frames.start_plain();
        Self {
            in_order,
            record_frames,
            held_close: None,
            records: Vec::new(),
            read_buffer,
            pinned_limit,
        }
    }

    /// The in-order stream skipped bytes (a replaced range, docs/wire.md §5.1): a frame
    /// begun before the skip will never end; the reader restarts at the next record.
    pub(crate) fn restart_in_order(&mut self) {
        self.in_order = Receiver::new(self.read_buffer, self.pinned_limit, true);
        self.in_order.start_plain();
    }

    /// Hands the session the in-order frames, then those of the out-of-order records, then
    /// the held CLOSE once the records read in order (up to `records_end`) have passed it.
    pub(crate) fn deliver(&mut self, now: Instant, session: &mut Session, records_end: u64) {
        while let Some(frame) = self.in_order.next_frame() {
            match frame {
                Ok(f) => session.handle_frame(now, f),
                Err(e) => session.handle_decode_error(now, e),
            }
        }
        for (offset, content) in std::mem::take(&mut self.records) {
            self.record_frames.push(&content);
            while let Some(frame) = self.record_frames.next_frame() {
                match frame {
                    Ok(f) if is_close(&f) => self.held_close = Some((offset, f)),
                    Ok(f) => session.handle_frame(now, f),
                    // The record authenticated: the peer sent this.
                    Err(e) => session.handle_decode_error(now, e),
                }
            }
            if self.record_frames.buffered() > 0 {
                // A record marked whole that ends inside a frame: the peer broke the format.
                session.handle_decode_error(now, FrameError::TooShort);
                self.record_frames = FrameReader::new(MAX_FRAME_BODY);
                self.record_frames.start_plain();
            }
        }
        if self
            .held_close
            .as_ref()
            .is_some_and(|(offset, _)| records_end > *offset)
            && let Some((_, f)) = self.held_close.take()
        {
            session.handle_frame(now, f);
        }
    }
}
