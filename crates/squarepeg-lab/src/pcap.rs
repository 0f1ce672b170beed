//! Classic pcap files of raw IP packets (LINKTYPE_RAW, 101), readable by tcpdump and tshark.
//!
//! Format: a 24-byte global header, then per packet a 16-byte record header (seconds,
//! sub-second part, captured length, original length) and the captured bytes; all fields in
//! the writer's byte order, which the magic number tells readers. Timestamps are given as a
//! [`Duration`] since the Unix epoch, so simulated runs (virtual time from zero) and real
//! captures (wall clock) use one writer.

use std::io::{self, Write};
use std::time::Duration;

use thiserror::Error;

/// LINKTYPE_RAW: each packet begins with an IPv4 or IPv6 header.
pub const LINKTYPE_RAW: u32 = 101;
/// Magic number of microsecond-resolution files.
pub const MAGIC_MICROS: u32 = 0xA1B2_C3D4;
/// Magic number of nanosecond-resolution files.
pub const MAGIC_NANOS: u32 = 0xA1B2_3C4D;
/// Default snapshot length: whole packets up to the largest IP packet.
pub const DEFAULT_SNAPLEN: u32 = 65_535;

/// Sub-second resolution of the timestamps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Resolution {
    /// Microseconds (the original format, readable everywhere).
    Micros,
    /// Nanoseconds (keeps virtual-time precision; tcpdump ≥ 4.6, Wireshark ≥ 1.10).
    #[default]
    Nanos,
}

/// Writes a pcap stream.
#[derive(Debug)]
pub struct PcapWriter<W: Write> {
    inner: W,
    snaplen: u32,
    resolution: Resolution,
    packets: u64,
}

impl<W: Write> PcapWriter<W> {
    /// Writes the global header: nanosecond timestamps, whole packets.
    pub fn new(inner: W) -> io::Result<Self> {
        Self::with_options(inner, Resolution::Nanos, DEFAULT_SNAPLEN)
    }

    /// Writes the global header with the given resolution and snapshot length (packets are cut
    /// to `snaplen` bytes, their original length still recorded).
    pub fn with_options(mut inner: W, resolution: Resolution, snaplen: u32) -> io::Result<Self> {
        let magic = match resolution {
            Resolution::Micros => MAGIC_MICROS,
            Resolution::Nanos => MAGIC_NANOS,
        };
        let mut header = [0u8; 24];
        header[0..4].copy_from_slice(&magic.to_le_bytes());
        header[4..6].copy_from_slice(&2u16.to_le_bytes()); // version 2.4
        header[6..8].copy_from_slice(&4u16.to_le_bytes());
        // thiszone and sigfigs stay 0.
        header[16..20].copy_from_slice(&snaplen.to_le_bytes());
        header[20..24].copy_from_slice(&LINKTYPE_RAW.to_le_bytes());
        inner.write_all(&header)?;
        Ok(Self {
            inner,
            snaplen,
            resolution,
            packets: 0,
        })
    }

    /// Appends a packet captured at `timestamp` (since the Unix epoch; up to year 2106).
    pub fn write_packet(&mut self, timestamp: Duration, packet: &[u8]) -> io::Result<()> {
        let seconds = u32::try_from(timestamp.as_secs()).map_err(|_| {
            io::Error::new(io::ErrorKind::InvalidInput, "pcap timestamps end in 2106")
        })?;
        let fraction = match self.resolution {
            Resolution::Micros => timestamp.subsec_micros(),
            Resolution::Nanos => timestamp.subsec_nanos(),
        };
        let original = u32::try_from(packet.len())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "packet above 4 GiB"))?;
        let captured = original.min(self.snaplen);
        let mut record = [0u8; 16];
        record[0..4].copy_from_slice(&seconds.to_le_bytes());
        record[4..8].copy_from_slice(&fraction.to_le_bytes());
        record[8..12].copy_from_slice(&captured.to_le_bytes());
        record[12..16].copy_from_slice(&original.to_le_bytes());
        self.inner.write_all(&record)?;
        self.inner.write_all(&packet[..captured as usize])?;
        self.packets += 1;
        Ok(())
    }

    /// Packets written so far.
    pub fn packets(&self) -> u64 {
        self.packets
    }

    /// Flushes the underlying writer.
    pub fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }

    /// Flushes and returns the underlying writer.
    pub fn into_inner(mut self) -> io::Result<W> {
        self.inner.flush()?;
        Ok(self.inner)
    }
}

/// Why bytes are not a pcap file this module reads.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum PcapError {
    /// Shorter than the global header or a record says.
    #[error("truncated pcap file at byte {0}")]
    Truncated(usize),
    /// Not a classic pcap magic number (pcapng is not read).
    #[error("unknown pcap magic number {0:#010x}")]
    BadMagic(u32),
    /// A record longer than the snapshot length.
    #[error("record at byte {0} is longer than the snapshot length")]
    RecordTooLong(usize),
}

/// A pcap file read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PcapFile {
    /// Timestamp resolution.
    pub resolution: Resolution,
    /// Snapshot length.
    pub snaplen: u32,
    /// Link type (101 for files this module writes).
    pub linktype: u32,
    /// The packets.
    pub records: Vec<PcapRecord>,
}

/// One packet of a pcap file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PcapRecord {
    /// Capture time since the Unix epoch.
    pub timestamp: Duration,
    /// Length on the wire.
    pub original_len: u32,
    /// The captured bytes.
    pub data: Vec<u8>,
}

/// Reads a classic pcap file of either byte order and resolution.
pub fn read_pcap(bytes: &[u8]) -> Result<PcapFile, PcapError> {
    let header = bytes.get(..24).ok_or(PcapError::Truncated(bytes.len()))?;
    let word = |b: &[u8], at: usize, little: bool| {
        let w = [b[at], b[at + 1], b[at + 2], b[at + 3]];
        if little {
            u32::from_le_bytes(w)
        } else {
            u32::from_be_bytes(w)
        }
    };
    let magic_le = word(header, 0, true);
    let (little, resolution) = match magic_le {
        MAGIC_MICROS => (true, Resolution::Micros),
        MAGIC_NANOS => (true, Resolution::Nanos),
        _ => match word(header, 0, false) {
            MAGIC_MICROS => (false, Resolution::Micros),
            MAGIC_NANOS => (false, Resolution::Nanos),
            other => return Err(PcapError::BadMagic(other)),
        },
    };
    let snaplen = word(header, 16, little);
    let linktype = word(header, 20, little);
    let mut records = Vec::new();
    let mut at = 24;
    while at < bytes.len() {
        let record = bytes.get(at..at + 16).ok_or(PcapError::Truncated(at))?;
        let seconds = word(record, 0, little);
        let fraction = word(record, 4, little);
        let captured = word(record, 8, little) as usize;
        let original_len = word(record, 12, little);
        if captured > snaplen as usize {
            return Err(PcapError::RecordTooLong(at));
        }
        let data = bytes
            .get(at + 16..at + 16 + captured)
            .ok_or(PcapError::Truncated(at))?
            .to_vec();
        let nanos = match resolution {
            Resolution::Micros => u64::from(fraction) * 1000,
            Resolution::Nanos => u64::from(fraction),
        };
        records.push(PcapRecord {
            timestamp: Duration::from_secs(u64::from(seconds)) + Duration::from_nanos(nanos),
            original_len,
            data,
        });
        at += 16 + captured;
    }
    Ok(PcapFile {
        resolution,
        snaplen,
        linktype,
        records,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_then_read() {
        let mut writer =
            PcapWriter::with_options(Vec::new(), Resolution::Nanos, 8).expect("header");
        writer
            .write_packet(Duration::new(3, 123_456_789), &[0x45, 1, 2, 3])
            .expect("write");
        writer
            .write_packet(Duration::new(4, 0), &[0x60; 10])
            .expect("write");
        assert_eq!(writer.packets(), 2);
        let bytes = writer.into_inner().expect("inner");
        assert_eq!(&bytes[..4], &[0x4D, 0x3C, 0xB2, 0xA1]);
        let file = read_pcap(&bytes).expect("read");
        assert_eq!(file.linktype, LINKTYPE_RAW);
        assert_eq!(file.resolution, Resolution::Nanos);
        assert_eq!(file.records.len(), 2);
        assert_eq!(file.records[0].timestamp, Duration::new(3, 123_456_789));
        assert_eq!(file.records[0].data, vec![0x45, 1, 2, 3]);
        // Cut to the snapshot length, original length kept.
        assert_eq!(file.records[1].data.len(), 8);
        assert_eq!(file.records[1].original_len, 10);
    }

    #[test]
    fn micros_and_errors() {
        let mut writer =
            PcapWriter::with_options(Vec::new(), Resolution::Micros, 100).expect("header");
        writer
            .write_packet(Duration::new(1, 999_999_999), &[1])
            .expect("write");
        assert!(
            writer
                .write_packet(Duration::from_secs(1 << 33), &[1])
                .is_err()
        );
        let bytes = writer.into_inner().expect("inner");
        let file = read_pcap(&bytes).expect("read");
        assert_eq!(file.records[0].timestamp, Duration::new(1, 999_999_000));
        assert_eq!(read_pcap(&bytes[..30]), Err(PcapError::Truncated(24)));
        assert_eq!(read_pcap(&[0; 24]), Err(PcapError::BadMagic(0)));
        assert_eq!(read_pcap(&[0; 3]), Err(PcapError::Truncated(3)));
    }
}
