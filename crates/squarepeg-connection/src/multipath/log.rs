//! What a connection of a multipath session sent and the peer has not yet acknowledged.

use std::collections::VecDeque;
use std::time::Instant;

use squarepeg_session::MessageNumber;

/// What a frame in the log is, for a re-send on another connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// This connection's own (PATH_ACK, PATH_PROBE): never re-sent elsewhere, and a
    /// PATH_ACK asks for no acknowledgement.
    Local { elicits_ack: bool },
    /// The session's: re-sent on another connection if this one dies unacknowledged, unless
    /// its deadline passed.
    Session {
        deadline: Option<Instant>,
        message: Option<MessageNumber>,
    },
}

impl Kind {
    /// Whether the peer acknowledges it (every frame but a PATH_ACK).
    fn elicits_ack(self) -> bool {
        !matches!(self, Kind::Local { elicits_ack: false })
    }
}

#[derive(Clone, Copy, Debug)]
struct Logged {
    /// Plaintext offset just past the frame.
    end: u64,
    kind: Kind,
    /// A copy of a frame a suspect connection holds: never copied again (a copy of a copy
    /// could bounce between two stalled connections).
    copy: bool,
}

/// A frame taken out of a dead connection's log, to be sent on another.
#[derive(Debug)]
pub(crate) struct Orphan {
    pub(crate) bytes: Vec<u8>,
    pub(crate) deadline: Option<Instant>,
    pub(crate) message: Option<MessageNumber>,
}

/// Why the peer's PATH_ACK is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BadAck {
    /// Beyond what was sent on the connection.
    BeyondSent { acked: u64, sent: u64 },
    /// Not at the end of a frame: the peer did not take what it claims.
    NotFrameEnd { acked: u64 },
}

/// One connection's plaintext stream as sent: `bytes[head..]` are the plaintext offsets
/// `[base, end)`; `[base, sealed)` went out in records, `[sealed, end)` waits to be sealed.
/// Acknowledged frames leave from the front.
#[derive(Debug, Default)]
pub(crate) struct SentLog {
    bytes: Vec<u8>,
    head: usize,
    base: u64,
    sealed: u64,
    frames: VecDeque<Logged>,
    /// How many of `frames` ask for an acknowledgement.
    eliciting: usize,
    /// The session's frames up to this offset have a copy on another connection (this one
    /// was suspect): they are not re-sent again when it dies.
    copied_to: u64,
    /// Where the last session frame that is not a copy ends.
    session_end: u64,
    /// When the plaintext up to each offset went into a record, one entry per seal, oldest
    /// first; entries the peer acknowledged leave (bounded as `frames` is).
    seals: VecDeque<(u64, Instant)>,
}

impl SentLog {
    pub(crate) fn end(&self) -> u64 {
        self.base + (self.bytes.len() - self.head) as u64
    }

    /// Plaintext offset acknowledged so far.
    pub(crate) fn acked(&self) -> u64 {
        self.base
    }

    /// Bytes held (unacknowledged, sealed or not).
    pub(crate) fn held(&self) -> usize {
        self.bytes.len() - self.head
    }

    pub(crate) fn unsealed_len(&self) -> usize {
        (self.end() - self.sealed) as usize
    }

    /// Whether frames asking for an acknowledgement are outstanding.
    pub(crate) fn awaits_ack(&self) -> bool {
        self.eliciting > 0
    }

    /// The buffer frames are appended to; call [`Self::logged`] for each one.
    pub(crate) fn buffer(&mut self) -> &mut Vec<u8> {
        &mut self.bytes
    }

    /// The frame just appended to [`Self::buffer`] ends the log now.
    pub(crate) fn logged(&mut self, kind: Kind) {
        self.log_frame(kind, false);
    }

    fn log_frame(&mut self, kind: Kind, copy: bool) {
        let end = self.end();
        self.eliciting += usize::from(kind.elicits_ack());
        if !copy && matches!(kind, Kind::Session { .. }) {
            self.session_end = end;
        }
        self.frames.push_back(Logged { end, kind, copy });
    }

    /// Appends a whole frame.
    pub(crate) fn push(&mut self, frame: &[u8], kind: Kind) {
        self.bytes.extend_from_slice(frame);
        self.logged(kind);
    }

    /// Appends a whole frame that is a copy of one a suspect connection holds.
    pub(crate) fn push_copy(&mut self, frame: &[u8], kind: Kind) {
        self.bytes.extend_from_slice(frame);
        self.log_frame(kind, true);
    }

    /// Cuts the frame that starts at buffer length `at` off the end (it goes elsewhere).
    pub(crate) fn cut_from(&mut self, at: usize, into: &mut Vec<u8>) {
        into.clear();
        into.extend_from_slice(&self.bytes[at..]);
        self.bytes.truncate(at);
    }

    /// The plaintext not yet sealed.
    pub(crate) fn unsealed(&self) -> &[u8] {
        let start = self.head + (self.sealed - self.base) as usize;
        &self.bytes[start..]
    }

    /// `n` more bytes of the plaintext went into a record at `now`.
    pub(crate) fn mark_sealed(&mut self, n: usize, now: Instant) {
        self.sealed += n as u64;
        self.seals.push_back((self.sealed, now));
    }

    /// The peer took everything up to `acked`: drops those frames and calls `gone` with
    /// each one's kind. Returns whether it acknowledged anything new.
    pub(crate) fn ack(&mut self, acked: u64, mut gone: impl FnMut(Kind)) -> Result<bool, BadAck> {
        if acked > self.sealed {
            return Err(BadAck::BeyondSent {
                acked,
                sent: self.sealed,
            });
        }
        if acked <= self.base {
            // Old news (acknowledgements may be re-sent).
            return Ok(false);
        }
        let ends_a_frame = self.frames.iter().any(|f| f.end == acked);
        if !ends_a_frame {
            return Err(BadAck::NotFrameEnd { acked });
        }
        while let Some(f) = self.frames.front().copied() {
            if f.end > acked {
                break;
            }
            self.frames.pop_front();
            self.eliciting -= usize::from(f.kind.elicits_ack());
            gone(f.kind);
        }
        self.head += (acked - self.base) as usize;
        self.base = acked;
        while self.seals.front().is_some_and(|&(end, _)| end <= acked) {
            self.seals.pop_front();
        }
        if self.head >= 64 * 1024 && self.head * 2 >= self.bytes.len() {
            self.bytes.drain(..self.head);
            self.head = 0;
        }
        Ok(true)
    }

    /// Whether unacknowledged session frames have no copy on another connection yet.
    pub(crate) fn has_uncopied(&self) -> bool {
        self.session_end > self.copied_to.max(self.base)
    }

    /// Copies of the unacknowledged session frames that have none yet (and are no copies
    /// themselves), in the order sent (the connection is suspect); they stay in the log
    /// until acknowledged or orphaned.
    pub(crate) fn copy_uncopied(&mut self) -> Vec<(Orphan, Kind)> {
        let from = self.copied_to;
        self.copied_to = self.end();
        self.session_frames(|f| f.end > from && !f.copy)
            .into_iter()
            .map(|(orphan, kind, _)| (orphan, kind))
            .collect()
    }

    /// The session's frames that are `wanted`, with their bytes and where they end.
    fn session_frames(&self, wanted: impl Fn(&Logged) -> bool) -> Vec<(Orphan, Kind, u64)> {
        let mut out = Vec::new();
        let mut start = self.base;
        for f in &self.frames {
            if let Kind::Session { deadline, message } = f.kind
                && wanted(f)
            {
                let from = self.head + (start - self.base) as usize;
                let to = self.head + (f.end - self.base) as usize;
                out.push((
                    Orphan {
                        bytes: self.bytes[from..to].to_vec(),
                        deadline,
                        message,
                    },
                    f.kind,
                    f.end,
                ));
            }
            start = f.end;
        }
        out
    }

    /// Everything unacknowledged that the session still wants and that has no copy
    /// elsewhere; `copied` hears of each session frame that has one. The log is emptied
    /// (the connection is gone).
    ///
    /// In the order sent, except that frames sealed at or before `arrived_before` (those
    /// the peer most likely took, though their acknowledgement did not come back) go after
    /// the others, each group in the order sent: after a sudden death the frames the peer
    /// is missing lead the re-send instead of waiting behind a round trip of frames it has.
    /// Also returns how many went after the others.
    pub(crate) fn take_orphans(
        &mut self,
        arrived_before: Option<Instant>,
        mut copied: impl FnMut(Kind),
    ) -> (Vec<(Orphan, Kind)>, usize) {
        let has_copy = |f: &Logged| f.end <= self.copied_to && !f.copy;
        let frames = self.session_frames(|f| !has_copy(f));
        // A frame was sealed when the first seal reaching its end was (never, if none did).
        let mut seals = self.seals.iter().peekable();
        let mut missing = Vec::with_capacity(frames.len());
        let mut arrived = Vec::new();
        for (orphan, kind, end) in frames {
            while seals.next_if(|&&(sealed, _)| sealed < end).is_some() {}
            let sealed_at = seals.peek().map(|&&(_, at)| at);
            if sealed_at
                .zip(arrived_before)
                .is_some_and(|(at, cutoff)| at <= cutoff)
            {
                arrived.push((orphan, kind));
            } else {
                missing.push((orphan, kind));
            }
        }
        let deferred = arrived.len();
        missing.append(&mut arrived);
        let out = (missing, deferred);
        for f in &self.frames {
            if has_copy(f) && matches!(f.kind, Kind::Session { .. }) {
                copied(f.kind);
            }
        }
        let end = self.end();
        self.frames.clear();
        self.eliciting = 0;
        self.bytes.clear();
        self.head = 0;
        self.base = end;
        self.sealed = end;
        self.copied_to = end;
        self.session_end = end;
        self.seals.clear();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Kind = Kind::Session {
        deadline: None,
        message: None,
    };
    const ACK: Kind = Kind::Local { elicits_ack: false };

    #[test]
    fn acknowledgements_must_end_a_frame_and_be_sent() {
        let mut log = SentLog::default();
        log.push(b"aaaa", S);
        log.push(b"bb", ACK);
        log.push(b"cccccc", S);
        assert_eq!(log.unsealed(), b"aaaabbcccccc");
        log.mark_sealed(6, Instant::now());
        assert_eq!(
            log.ack(12, |_| {}),
            Err(BadAck::BeyondSent { acked: 12, sent: 6 })
        );
        assert_eq!(log.ack(3, |_| {}), Err(BadAck::NotFrameEnd { acked: 3 }));
        let mut gone = Vec::new();
        assert_eq!(log.ack(6, |k| gone.push(k)), Ok(true));
        assert_eq!(gone, [S, ACK]);
        assert_eq!(log.ack(4, |_| {}), Ok(false));
        assert!(log.awaits_ack());
        assert_eq!(log.unsealed(), b"cccccc");
        let (orphans, _) = log.take_orphans(None, |_| panic!("nothing was copied"));
        assert_eq!(orphans.len(), 1);
        assert_eq!(orphans[0].0.bytes, b"cccccc");
        assert_eq!(log.held(), 0);
        assert!(!log.awaits_ack());
    }

    #[test]
    fn copied_frames_are_not_orphaned_twice() {
        let mut log = SentLog::default();
        log.push(b"aaaa", S);
        log.push(b"bb", ACK);
        log.push(b"ccc", S);
        log.mark_sealed(9, Instant::now());
        assert!(log.has_uncopied());
        let copies = log.copy_uncopied();
        let bytes: Vec<&[u8]> = copies.iter().map(|(o, _)| &o.bytes[..]).collect();
        assert_eq!(bytes, [&b"aaaa"[..], b"ccc"]);
        assert!(!log.has_uncopied());
        // Still held until acknowledged; a later frame is copied on its own.
        assert_eq!(log.held(), 9);
        log.push(b"d", ACK);
        assert!(!log.has_uncopied(), "a local frame is not the session's");
        log.push_copy(b"ff", S);
        assert!(!log.has_uncopied(), "a copy is not copied again");
        log.push(b"ee", S);
        assert!(log.has_uncopied());
        assert_eq!(log.ack(4, |_| {}), Ok(true));
        let mut copied = 0;
        let (orphans, _) = log.take_orphans(None, |_| copied += 1);
        assert_eq!(copied, 1, "ccc has its copy");
        let bytes: Vec<&[u8]> = orphans.iter().map(|(o, _)| &o.bytes[..]).collect();
        assert_eq!(
            bytes,
            [&b"ff"[..], b"ee"],
            "a copy's original may be gone too"
        );
        assert!(!log.has_uncopied());
    }

    #[test]
    fn frames_the_peer_most_likely_has_are_orphaned_last() {
        let t0 = Instant::now();
        let ms = std::time::Duration::from_millis;
        let mut log = SentLog::default();
        log.push(b"aa", S);
        log.push(b"bb", S);
        log.mark_sealed(4, t0);
        log.push(b"k", ACK);
        log.push(b"cc", S);
        log.mark_sealed(3, t0 + ms(10));
        log.push(b"dd", S);
        log.mark_sealed(1, t0 + ms(20));
        log.push(b"ee", S);
        assert_eq!(log.ack(2, |_| {}), Ok(true));
        // Sealed by 10 ms: bb and cc; dd was only partly sealed then, ee never.
        let (orphans, deferred) = log.take_orphans(Some(t0 + ms(10)), |_| {});
        let bytes: Vec<&[u8]> = orphans.iter().map(|(o, _)| &o.bytes[..]).collect();
        assert_eq!(bytes, [&b"dd"[..], b"ee", b"bb", b"cc"]);
        assert_eq!(deferred, 2);
        // Without a cutoff, the order sent.
        let mut log = SentLog::default();
        log.push(b"aa", S);
        log.push(b"bb", S);
        log.mark_sealed(2, t0);
        let (orphans, deferred) = log.take_orphans(None, |_| {});
        let bytes: Vec<&[u8]> = orphans.iter().map(|(o, _)| &o.bytes[..]).collect();
        assert_eq!(bytes, [&b"aa"[..], b"bb"]);
        assert_eq!(deferred, 0);
    }
}
