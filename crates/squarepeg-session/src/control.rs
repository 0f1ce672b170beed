//! Control frames: the payload of a `FrameHeader::Control` frame, specified
//! byte by byte in docs/wire.md §2.
//!
//! ```text
//! type (1 byte) ‖ type-specific fields (QUIC varints, RFC 9000 §16)
//! ```
//!
//! Every control frame is idempotent and every limit only grows, so a
//! receiver handed duplicated or reordered frames by an out-of-order
//! substrate reaches the same state (Minion §4.1, Hollywood §4.3).

use squarepeg_framing::varint;

/// Control frame type bytes (docs/wire.md §2).
pub mod frame_type {
    pub const PARAMS: u8 = 0x01;
    pub const MAX_DATA: u8 = 0x02;
    pub const MAX_STREAM_DATA: u8 = 0x03;
    pub const MAX_STREAMS: u8 = 0x04;
    pub const RESET_STREAM: u8 = 0x05;
    pub const STOP_SENDING: u8 = 0x06;
    pub const CLOSE: u8 = 0x07;
    pub const APPLICATION_CLOSE: u8 = 0x08;
    pub const RECORDS_REPLACED: u8 = 0x09;
    pub const PATH_ACK: u8 = 0x0a;
    pub const PATH_PROBE: u8 = 0x0b;
    pub const ADD_ADDRESS: u8 = 0x0c;
    pub const REMOVE_ADDRESS: u8 = 0x0d;
}

/// PARAMS identifiers (docs/wire.md §2.2). Unknown identifiers are ignored,
/// which is how later versions add parameters.
pub mod param_id {
    pub const INITIAL_MAX_DATA: u64 = 0x01;
    pub const INITIAL_MAX_STREAM_DATA: u64 = 0x02;
    pub const INITIAL_MAX_STREAMS: u64 = 0x03;
    pub const RECEIVE_FORMATS: u64 = 0x04;
    pub const RECORD_NUMBERS: u64 = 0x05;
}

/// The longest CLOSE reason a sender writes and a receiver accepts.
pub const MAX_REASON_LEN: usize = 1024;

/// The receive limits an endpoint announces in its PARAMS frame.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Params {
    /// Connection-wide limit on stream bytes the peer may send.
    pub initial_max_data: Option<u64>,
    /// Per-stream limit on bytes the peer may send, for every stream.
    pub initial_max_stream_data: Option<u64>,
    /// How many streams the peer may open (cumulative count).
    pub initial_max_streams: Option<u64>,
    /// The frame formats the sender reads after a Switch, as bits of format ids
    /// (docs/wire.md §3); absent: uCOBS only.
    pub receive_formats: Option<u64>,
    /// Inside TLS: how the sender reads numbered records (docs/wire.md §5), as bits:
    /// [`record_numbers::READS`] it reads them, [`record_numbers::OUT_OF_ORDER`] it reads
    /// records out of order and asks for them; absent: neither.
    pub record_numbers: Option<u64>,
}

/// Bits of PARAMS `record_numbers` (docs/wire.md §5).
pub mod record_numbers {
    /// The sender of the PARAMS reads numbered records.
    pub const READS: u64 = 0b01;
    /// It reads records out of order: number yours.
    pub const OUT_OF_ORDER: u64 = 0b10;
    /// Its retransmissions may carry other records than the originals (inconsistent
    /// retransmissions, docs/wire.md §5.1): it announces them with RECORDS_REPLACED.
    pub const REPLACES: u64 = 0b100;
}

/// A decoded control frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ControlFrame {
    /// The sender's receive limits; sent once, first, by each side.
    Params(Params),
    /// The peer may send stream bytes up to this connection-wide total.
    MaxData(u64),
    /// The peer may send bytes of `stream` up to offset `max`.
    MaxStreamData { stream: u64, max: u64 },
    /// The peer may open streams while its count of opened streams is below
    /// `max`.
    MaxStreams(u64),
    /// The sender abandons its side of `stream` at `final_size`.
    ResetStream {
        stream: u64,
        code: u64,
        final_size: u64,
    },
    /// The sender no longer reads `stream`; the peer should reset it.
    StopSending { stream: u64, code: u64 },
    /// The connection is closed because of a transport error (or
    /// `TransportErrorCode::NoError`).
    Close { code: u64, reason: Vec<u8> },
    /// The application closed the connection with its own code.
    ApplicationClose { code: u64, reason: Vec<u8> },
    /// Inside TLS with numbered records: the sender's retransmission of the stream bytes
    /// `[start, start + len)` carried other records (inconsistent retransmission), so a
    /// receiver may skip bytes there that do not authenticate (docs/wire.md §5.1). Sent only
    /// to a peer whose PARAMS `record_numbers` has [`record_numbers::OUT_OF_ORDER`].
    RecordsReplaced { start: u64, len: u64 },
    /// A session over several connections (docs/wire.md §7): the sender has received and
    /// taken the first `received` plaintext bytes the peer sent on *this* connection (whole
    /// frames). The peer keeps what it sent on a connection until acknowledged, and re-sends
    /// the rest on another connection when this one dies.
    PathAck { received: u64 },
    /// Asks for a [`ControlFrame::PathAck`] on this connection: a liveness probe.
    PathProbe,
    /// The sender can also be reached at `addr` (`id` names it for a later withdrawal).
    AddAddress { id: u64, addr: std::net::SocketAddr },
    /// The address announced as `id` is gone.
    RemoveAddress { id: u64 },
}

/// A control body that cannot be parsed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ControlError {
    #[error("empty control frame")]
    Empty,
    #[error("unknown control frame type {0:#04x}")]
    UnknownType(u8),
    #[error("control frame type {0:#04x} truncated")]
    Truncated(u8),
    #[error("{extra} trailing bytes after control frame type {ty:#04x}")]
    TrailingBytes { ty: u8, extra: usize },
    #[error("close reason of {0} bytes exceeds {MAX_REASON_LEN}")]
    ReasonTooLong(u64),
    #[error("value {0} does not fit a varint")]
    ValueTooLarge(u64),
    #[error("unknown address family {0}")]
    AddressFamily(u8),
}

struct Reader<'a> {
    ty: u8,
    buf: &'a [u8],
}

impl Reader<'_> {
    fn varint(&mut self) -> Result<u64, ControlError> {
        let (v, n) = varint::decode(self.buf).map_err(|_| ControlError::Truncated(self.ty))?;
        self.buf = &self.buf[n..];
        Ok(v)
    }

    fn finish(self) -> Result<(), ControlError> {
        if self.buf.is_empty() {
            Ok(())
        } else {
            Err(ControlError::TrailingBytes {
                ty: self.ty,
                extra: self.buf.len(),
            })
        }
    }

    fn bytes<const N: usize>(&mut self) -> Result<[u8; N], ControlError> {
        let (head, rest) = self
            .buf
            .split_first_chunk::<N>()
            .ok_or(ControlError::Truncated(self.ty))?;
        self.buf = rest;
        Ok(*head)
    }

    /// `family (4 | 6) ‖ address ‖ port (2 bytes, big endian)`.
    fn socket_addr(&mut self) -> Result<std::net::SocketAddr, ControlError> {
        let [family] = self.bytes::<1>()?;
        let ip = match family {
            4 => std::net::IpAddr::from(self.bytes::<4>()?),
            6 => std::net::IpAddr::from(self.bytes::<16>()?),
            other => return Err(ControlError::AddressFamily(other)),
        };
        let port = u16::from_be_bytes(self.bytes::<2>()?);
        Ok(std::net::SocketAddr::new(ip, port))
    }

    fn reason(&mut self) -> Result<Vec<u8>, ControlError> {
        let len = self.varint()?;
        if len > MAX_REASON_LEN as u64 {
            return Err(ControlError::ReasonTooLong(len));
        }
        let len = len as usize;
        let bytes = self
            .buf
            .get(..len)
            .ok_or(ControlError::Truncated(self.ty))?;
        self.buf = &self.buf[len..];
        Ok(bytes.to_vec())
    }
}

fn put(v: u64, out: &mut Vec<u8>) -> Result<(), ControlError> {
    varint::encode(v, out).map_err(|_| ControlError::ValueTooLarge(v))
}

impl ControlFrame {
    /// The type byte this frame starts with.
    pub fn frame_type(&self) -> u8 {
        use frame_type::*;
        match self {
            Self::Params(_) => PARAMS,
            Self::MaxData(_) => MAX_DATA,
            Self::MaxStreamData { .. } => MAX_STREAM_DATA,
            Self::MaxStreams(_) => MAX_STREAMS,
            Self::ResetStream { .. } => RESET_STREAM,
            Self::StopSending { .. } => STOP_SENDING,
            Self::Close { .. } => CLOSE,
            Self::ApplicationClose { .. } => APPLICATION_CLOSE,
            Self::RecordsReplaced { .. } => RECORDS_REPLACED,
            Self::PathAck { .. } => PATH_ACK,
            Self::PathProbe => PATH_PROBE,
            Self::AddAddress { .. } => ADD_ADDRESS,
            Self::RemoveAddress { .. } => REMOVE_ADDRESS,
        }
    }

    /// Appends the control body to `out`. Close reasons longer than
    /// [`MAX_REASON_LEN`] are truncated. On error `out` may hold a partial
    /// body; callers discard it.
    pub fn encode(&self, out: &mut Vec<u8>) -> Result<(), ControlError> {
        out.push(self.frame_type());
        match self {
            Self::Params(p) => {
                let pairs = [
                    (param_id::INITIAL_MAX_DATA, p.initial_max_data),
                    (param_id::INITIAL_MAX_STREAM_DATA, p.initial_max_stream_data),
                    (param_id::INITIAL_MAX_STREAMS, p.initial_max_streams),
                    (param_id::RECEIVE_FORMATS, p.receive_formats),
                    (param_id::RECORD_NUMBERS, p.record_numbers),
                ];
                for (id, value) in pairs {
                    if let Some(v) = value {
                        put(id, out)?;
                        put(v, out)?;
                    }
                }
            }
            Self::MaxData(v) | Self::MaxStreams(v) => put(*v, out)?,
            Self::MaxStreamData { stream, max } => {
                put(*stream, out)?;
                put(*max, out)?;
            }
            Self::ResetStream {
                stream,
                code,
                final_size,
            } => {
                put(*stream, out)?;
                put(*code, out)?;
                put(*final_size, out)?;
            }
            Self::StopSending { stream, code } => {
                put(*stream, out)?;
                put(*code, out)?;
            }
            Self::RecordsReplaced { start, len } => {
                put(*start, out)?;
                put(*len, out)?;
            }
            Self::PathAck { received } => put(*received, out)?,
            Self::PathProbe => {}
            Self::AddAddress { id, addr } => {
                put(*id, out)?;
                match addr.ip() {
                    std::net::IpAddr::V4(ip) => {
                        out.push(4);
                        out.extend_from_slice(&ip.octets());
                    }
                    std::net::IpAddr::V6(ip) => {
                        out.push(6);
                        out.extend_from_slice(&ip.octets());
                    }
                }
                out.extend_from_slice(&addr.port().to_be_bytes());
            }
            Self::RemoveAddress { id } => put(*id, out)?,
            Self::Close { code, reason } | Self::ApplicationClose { code, reason } => {
                put(*code, out)?;
                let reason = &reason[..reason.len().min(MAX_REASON_LEN)];
                put(reason.len() as u64, out)?;
                out.extend_from_slice(reason);
            }
        }
        Ok(())
    }

    /// Parses a control body (the payload of a control frame).
    pub fn decode(body: &[u8]) -> Result<Self, ControlError> {
        use frame_type::*;
        let (&ty, rest) = body.split_first().ok_or(ControlError::Empty)?;
        let mut r = Reader { ty, buf: rest };
        let frame = match ty {
            PARAMS => {
                let mut p = Params::default();
                while !r.buf.is_empty() {
                    let id = r.varint()?;
                    let value = r.varint()?;
                    match id {
                        param_id::INITIAL_MAX_DATA => p.initial_max_data = Some(value),
                        param_id::INITIAL_MAX_STREAM_DATA => {
                            p.initial_max_stream_data = Some(value)
                        }
                        param_id::INITIAL_MAX_STREAMS => p.initial_max_streams = Some(value),
                        param_id::RECEIVE_FORMATS => p.receive_formats = Some(value),
                        param_id::RECORD_NUMBERS => p.record_numbers = Some(value),
                        // Unknown parameters are ignored (docs/wire.md §2.2).
                        _ => {}
                    }
                }
                Self::Params(p)
            }
            MAX_DATA => Self::MaxData(r.varint()?),
            MAX_STREAM_DATA => Self::MaxStreamData {
                stream: r.varint()?,
                max: r.varint()?,
            },
            MAX_STREAMS => Self::MaxStreams(r.varint()?),
            RESET_STREAM => Self::ResetStream {
                stream: r.varint()?,
                code: r.varint()?,
                final_size: r.varint()?,
            },
            STOP_SENDING => Self::StopSending {
                stream: r.varint()?,
                code: r.varint()?,
            },
            CLOSE => Self::Close {
                code: r.varint()?,
                reason: r.reason()?,
            },
            APPLICATION_CLOSE => Self::ApplicationClose {
                code: r.varint()?,
                reason: r.reason()?,
            },
            RECORDS_REPLACED => Self::RecordsReplaced {
                start: r.varint()?,
                len: r.varint()?,
            },
            PATH_ACK => Self::PathAck {
                received: r.varint()?,
            },
            PATH_PROBE => Self::PathProbe,
            ADD_ADDRESS => Self::AddAddress {
                id: r.varint()?,
                addr: r.socket_addr()?,
            },
            REMOVE_ADDRESS => Self::RemoveAddress { id: r.varint()? },
            other => return Err(ControlError::UnknownType(other)),
        };
        r.finish()?;
        Ok(frame)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(f: ControlFrame) {
        let mut out = Vec::new();
        f.encode(&mut out).unwrap();
        assert_eq!(ControlFrame::decode(&out).unwrap(), f, "{out:02x?}");
    }

    #[test]
    fn round_trips() {
        round_trip(ControlFrame::Params(Params {
            initial_max_data: Some(1 << 24),
            initial_max_stream_data: Some(1 << 20),
            initial_max_streams: Some(100),
            receive_formats: Some(0b11),
            record_numbers: Some(0b11),
        }));
        round_trip(ControlFrame::Params(Params::default()));
        round_trip(ControlFrame::MaxData(varint::MAX));
        round_trip(ControlFrame::MaxStreamData {
            stream: 5,
            max: 70000,
        });
        round_trip(ControlFrame::MaxStreams(0));
        round_trip(ControlFrame::ResetStream {
            stream: 4,
            code: 9,
            final_size: 1 << 40,
        });
        round_trip(ControlFrame::StopSending { stream: 1, code: 2 });
        round_trip(ControlFrame::Close {
            code: 3,
            reason: b"flow".to_vec(),
        });
        round_trip(ControlFrame::ApplicationClose {
            code: 0,
            reason: vec![],
        });
        round_trip(ControlFrame::RecordsReplaced {
            start: 1 << 40,
            len: 27,
        });
        round_trip(ControlFrame::PathAck { received: 1 << 33 });
        round_trip(ControlFrame::PathProbe);
        round_trip(ControlFrame::AddAddress {
            id: 2,
            addr: "192.0.2.7:443".parse().unwrap(),
        });
        round_trip(ControlFrame::AddAddress {
            id: 3,
            addr: "[2001:db8::1]:8443".parse().unwrap(),
        });
        round_trip(ControlFrame::RemoveAddress { id: 2 });
    }

    #[test]
    fn address_test_vector() {
        // docs/wire.md §7.
        let mut out = Vec::new();
        ControlFrame::AddAddress {
            id: 1,
            addr: "192.0.2.7:443".parse().unwrap(),
        }
        .encode(&mut out)
        .unwrap();
        assert_eq!(out, [0x0c, 0x01, 0x04, 192, 0, 2, 7, 0x01, 0xbb]);
        assert_eq!(
            ControlFrame::decode(&[0x0c, 0x01, 0x05, 1]).unwrap_err(),
            ControlError::AddressFamily(5)
        );
        assert_eq!(
            ControlFrame::decode(&[0x0c, 0x01, 0x04, 1, 2]).unwrap_err(),
            ControlError::Truncated(0x0c)
        );
    }

    #[test]
    fn rejects_bad_bodies() {
        use ControlError::*;
        let cases: [(&[u8], ControlError); 8] = [
            (&[], Empty),
            (&[0x00], UnknownType(0)),
            (&[0x0e, 1], UnknownType(0x0e)),
            (&[0x09, 1], Truncated(9)),
            (&[0x02], Truncated(2)),
            (&[0x02, 0x05, 0x00], TrailingBytes { ty: 2, extra: 1 }),
            (&[0x07, 0x00, 0x05, b'a'], Truncated(7)),
            (&[0x01, 0x01], Truncated(1)),
        ];
        for (bytes, err) in cases {
            assert_eq!(
                ControlFrame::decode(bytes).unwrap_err(),
                err,
                "{bytes:02x?}"
            );
        }
        let mut long = vec![0x08, 0x00, 0x48, 0x01];
        long.extend(std::iter::repeat_n(b'x', 0x801));
        assert_eq!(ControlFrame::decode(&long), Err(ReasonTooLong(0x801)));
    }

    #[test]
    fn unknown_params_are_ignored() {
        // id 0x3f = 7 (unknown), then id 3 = 10.
        let body = [0x01, 0x3f, 0x07, 0x03, 0x0a];
        assert_eq!(
            ControlFrame::decode(&body).unwrap(),
            ControlFrame::Params(Params {
                initial_max_streams: Some(10),
                ..Params::default()
            })
        );
    }

    #[test]
    fn reason_truncated_on_encode() {
        let mut out = Vec::new();
        ControlFrame::Close {
            code: 1,
            reason: vec![b'r'; MAX_REASON_LEN + 10],
        }
        .encode(&mut out)
        .unwrap();
        match ControlFrame::decode(&out).unwrap() {
            ControlFrame::Close { reason, .. } => assert_eq!(reason.len(), MAX_REASON_LEN),
            other => panic!("{other:?}"),
        }
    }
}
