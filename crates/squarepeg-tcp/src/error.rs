//! Error and drop-reason types.

use thiserror::Error;

/// Why an incoming packet was dropped (not, or not wholly, processed). Every reason is counted
/// in [`EndpointStats`](crate::EndpointStats).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Error)]
#[non_exhaustive]
pub enum DropReason {
    #[error("packet shorter than its IP header")]
    Truncated,
    #[error("IP version is neither 4 nor 6")]
    UnsupportedIpVersion,
    #[error("malformed IP header (length fields or extension headers)")]
    BadIpHeader,
    #[error("bad IPv4 header checksum")]
    BadIpChecksum,
    #[error("IP fragment (not reassembled)")]
    Fragment,
    #[error("not a TCP packet")]
    NotTcp,
    #[error("TCP header truncated")]
    TruncatedTcpHeader,
    #[error("TCP data offset outside the segment")]
    BadDataOffset,
    #[error("bad TCP checksum")]
    BadTcpChecksum,
    #[error("TCP option with an illegal length")]
    BadOptionLength,
    #[error("source or destination is not a unicast address, or a port is zero")]
    BadAddress,
    #[error("no connection or listener for this segment")]
    NoConnection,
    #[error("segment not acceptable in LISTEN")]
    ListenerRejected,
    #[error("listen backlog full")]
    BacklogFull,
    #[error("connection limit reached")]
    TooManyConnections,
    #[error("invalid SYN cookie")]
    BadSynCookie,
    #[error("segment not acceptable in this state")]
    InvalidForState,
    #[error("rejected by PAWS (old timestamp)")]
    Paws,
    #[error("segment outside the receive window")]
    OutOfWindow,
    #[error("unacceptable acknowledgment number")]
    BadAck,
    #[error("reset ignored (out of window or unacceptable)")]
    RstIgnored,
    #[error("in-window reset answered with a challenge ACK")]
    RstChallenged,
    #[error("SYN in a synchronized state answered with a challenge ACK")]
    SynChallenged,
    #[error("timestamps negotiated but segment carries none")]
    MissingTimestamp,
    #[error("segment without ACK in a synchronized state")]
    NoAck,
    #[error("out-of-order queue full")]
    OutOfOrderQueueFull,
    #[error("destination is not one of the endpoint's addresses")]
    NotLocal,
    #[error("ICMP error not believed (no such connection, or it quotes nothing in flight)")]
    IcmpIgnored,
}

impl DropReason {
    /// All reasons, in counter order.
    pub const ALL: [DropReason; 28] = [
        DropReason::Truncated,
        DropReason::UnsupportedIpVersion,
        DropReason::BadIpHeader,
        DropReason::BadIpChecksum,
        DropReason::Fragment,
        DropReason::NotTcp,
        DropReason::TruncatedTcpHeader,
        DropReason::BadDataOffset,
        DropReason::BadTcpChecksum,
        DropReason::BadOptionLength,
        DropReason::BadAddress,
        DropReason::NoConnection,
        DropReason::ListenerRejected,
        DropReason::BacklogFull,
        DropReason::TooManyConnections,
        DropReason::BadSynCookie,
        DropReason::InvalidForState,
        DropReason::Paws,
        DropReason::OutOfWindow,
        DropReason::BadAck,
        DropReason::RstIgnored,
        DropReason::RstChallenged,
        DropReason::SynChallenged,
        DropReason::MissingTimestamp,
        DropReason::NoAck,
        DropReason::OutOfOrderQueueFull,
        DropReason::NotLocal,
        DropReason::IcmpIgnored,
    ];

    pub(crate) fn index(self) -> usize {
        DropReason::ALL.iter().position(|r| *r == self).unwrap_or(0)
    }
}

/// Errors of connection operations (`connect`, `read`, `write`, ...).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum Error {
    #[error("unknown or released connection handle")]
    UnknownConnection,
    #[error("unknown listener handle")]
    UnknownListener,
    #[error("operation would block")]
    WouldBlock,
    #[error("connection is not yet established")]
    NotConnected,
    #[error("sending side already shut down")]
    SendShutdown,
    #[error("connection reset by peer")]
    ConnectionReset,
    #[error("connection refused")]
    ConnectionRefused,
    #[error("connection timed out")]
    TimedOut,
    #[error("connection aborted locally")]
    Aborted,
    #[error("connection closed")]
    Closed,
    #[error("address already in use")]
    AddressInUse,
    #[error("invalid address: {0}")]
    InvalidAddress(&'static str),
    #[error("connection limit reached")]
    TooManyConnections,
    #[error("invalid range or length for a send-queue operation")]
    InvalidRange,
    #[error("a message must hold at least one byte")]
    EmptyMessage,
    #[error("malformed write record: {0}")]
    BadRecord(&'static str),
    #[error("read buffer of {0} bytes cannot hold a record (at least {min})", min = crate::utcp::MIN_READ_BUFFER)]
    ReadBufferTooSmall(usize),
    #[error("unordered receive is not on for this connection")]
    NotUnordered,
}
