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
        let end = self.end();
        self.eliciting += usize::from(kind.elicits_ack());
        self.frames.push_back(Logged { end, kind });
    }

    /// Appends a whole frame.
    pub(crate) fn push(&mut self, frame: &[u8], kind: Kind) {
        self.bytes.extend_from_slice(frame);
        self.logged(kind);
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

    pub(crate) fn mark_sealed(&mut self, n: usize) {
        self.sealed += n as u64;
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
        if self.head >= 64 * 1024 && self.head * 2 >= self.bytes.len() {
            self.bytes.drain(..self.head);
            self.head = 0;
        }
        Ok(true)
    }

    /// Everything unacknowledged that the session still wants, in the order sent: the
    /// log is emptied (the connection is gone).
    pub(crate) fn take_orphans(&mut self) -> Vec<(Orphan, Kind)> {
        let mut out = Vec::new();
        let mut start = self.base;
        for f in self.frames.drain(..) {
            let from = self.head + (start - self.base) as usize;
            let to = self.head + (f.end - self.base) as usize;
            if let Kind::Session { deadline, message } = f.kind {
                out.push((
                    Orphan {
                        bytes: self.bytes[from..to].to_vec(),
                        deadline,
                        message,
                    },
                    f.kind,
                ));
            }
            start = f.end;
        }
        let end = self.end();
        self.eliciting = 0;
        self.bytes.clear();
        self.head = 0;
        self.base = end;
        self.sealed = end;
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
        log.mark_sealed(6);
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
        let orphans = log.take_orphans();
        assert_eq!(orphans.len(), 1);
        assert_eq!(orphans[0].0.bytes, b"cccccc");
        assert_eq!(log.held(), 0);
        assert!(!log.awaits_ack());
    }
}
