//! How much unsent data the kernel may hold (late binding, Hollywood §4.2 and
//! ARCHITECTURE.md): a `TCP_NOTSENT_LOWAT` that follows the connection's
//! delivery rate.
//!
//! Whatever the kernel holds unsent is committed: an urgent message waits
//! behind it (and behind what is in flight), so the less the better. But the
//! driver must refill the kernel before it runs dry, or throughput drops:
//! when the socket turns writable the kernel still has about one lowat of
//! unsent data, which lasts `lowat / rate`. A lowat worth a few milliseconds
//! at the measured delivery rate (`TCP_INFO`'s `tcpi_delivery_rate`, Linux
//! 4.9 and later) keeps the link busy through a late wake-up of the driver
//! while binding late: 8 KiB on an 8 Mbit/s path (8 ms of data) instead of a
//! fixed 64 KiB (64 ms), and the configured maximum on fast paths, where the
//! fixed value was already small in time.

use std::time::{Duration, Instant};

use tokio::net::TcpStream;

/// The smallest lowat the driver sets: below this, writes (one per lowat)
/// would cost more than they bind (8 KiB is 8 ms at 8 Mbit/s).
pub(crate) const MIN_NOTSENT_LOWAT: u32 = 8 * 1024;

/// How often the delivery rate is read (one `getsockopt` each time).
const CHECK_EVERY: Duration = Duration::from_millis(50);

/// The lowat for a delivery rate of `rate` bytes per second: `drain`'s worth
/// of data, between [`MIN_NOTSENT_LOWAT`] (or `max`, if smaller) and `max`.
pub(crate) fn lowat_for(rate: u64, drain: Duration, max: u32) -> u32 {
    let bytes = (u128::from(rate) * drain.as_nanos() / 1_000_000_000).min(u128::from(u32::MAX));
    (bytes as u32).clamp(MIN_NOTSENT_LOWAT.min(max), max)
}

/// The lowat of one connection, adapted to its delivery rate.
#[derive(Debug)]
pub(crate) struct AdaptiveLowat {
    drain: Duration,
    max: u32,
    current: u32,
    next_check: Option<Instant>,
}

impl AdaptiveLowat {
    /// Starts at `max` (set on the socket already): until data has been
    /// delivered there is no rate to follow.
    pub(crate) fn new(drain: Duration, max: u32) -> Self {
        Self {
            drain,
            max,
            current: max,
            next_check: None,
        }
    }

    /// Reads the delivery rate if it is time to, and changes the socket's
    /// lowat when the rate calls for one at least a quarter different.
    /// Returns the new lowat if it changed.
    pub(crate) fn update(&mut self, now: Instant, socket: &TcpStream) -> Option<u32> {
        if self.next_check.is_some_and(|t| now < t) {
            return None;
        }
        self.next_check = Some(now + CHECK_EVERY);
        let rate = delivery_rate(socket)?;
        if rate == 0 {
            return None;
        }
        let target = lowat_for(rate, self.drain, self.max);
        let (lo, hi) = (
            self.current - self.current / 4,
            self.current + self.current / 4,
        );
        if (lo..=hi).contains(&target) {
            return None;
        }
        crate::kernel::set_notsent_lowat(socket, target).ok()?;
        self.current = target;
        Some(target)
    }
}

/// The kernel's `TCP_INFO` for `socket`, and how many bytes of it the kernel
/// filled.
#[cfg(target_os = "linux")]
fn tcp_info(socket: &TcpStream) -> Option<(libc::tcp_info, usize)> {
    use std::os::fd::AsRawFd;
    // SAFETY: all-zero is a valid tcp_info; getsockopt writes at most `len`
    // bytes into it and reports how many.
    unsafe {
        let mut info: libc::tcp_info = std::mem::zeroed();
        let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
        let r = libc::getsockopt(
            socket.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&mut info as *mut libc::tcp_info).cast(),
            &mut len,
        );
        if r != 0 {
            return None;
        }
        Some((info, len as usize))
    }
}

/// The connection's delivery rate in bytes per second (`None` where the
/// kernel does not say).
#[cfg(target_os = "linux")]
fn delivery_rate(socket: &TcpStream) -> Option<u64> {
    let (info, len) = tcp_info(socket)?;
    // Kernels before 4.9 return a shorter struct without the rate.
    let end = std::mem::offset_of!(libc::tcp_info, tcpi_delivery_rate) + 8;
    (len >= end).then_some(info.tcpi_delivery_rate)
}

#[cfg(not(target_os = "linux"))]
fn delivery_rate(_socket: &TcpStream) -> Option<u64> {
    None
}

/// What the peer acknowledges, for the dead-peer watch (`KernelWire::check_peer`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct AckState {
    /// Segments sent and not yet acknowledged (`tcpi_unacked`).
    pub unacked: u32,
    /// How long ago the last acknowledgement came (`tcpi_last_ack_recv`; a window probe's
    /// answer, or one that acknowledges nothing new, counts).
    pub since_last_ack: Duration,
    /// Bytes acknowledged so far (`tcpi_bytes_acked`, Linux 4.2 and later; `None` before).
    pub bytes_acked: Option<u64>,
}

#[cfg(target_os = "linux")]
pub(crate) fn ack_state(socket: &TcpStream) -> Option<AckState> {
    let (info, len) = tcp_info(socket)?;
    let end = std::mem::offset_of!(libc::tcp_info, tcpi_bytes_acked) + 8;
    Some(AckState {
        unacked: info.tcpi_unacked,
        since_last_ack: Duration::from_millis(u64::from(info.tcpi_last_ack_recv)),
        bytes_acked: (len >= end).then_some(info.tcpi_bytes_acked),
    })
}

#[cfg(not(target_os = "linux"))]
pub(crate) fn ack_state(_socket: &TcpStream) -> Option<AckState> {
    None
}

/// The connection's sending maximum segment size (`tcpi_snd_mss`: the
/// path's MTU less the headers and the options every segment carries).
#[cfg(target_os = "linux")]
pub(crate) fn send_mss(socket: &TcpStream) -> Option<usize> {
    let (info, _) = tcp_info(socket)?;
    (info.tcpi_snd_mss > 0).then_some(info.tcpi_snd_mss as usize)
}

#[cfg(not(target_os = "linux"))]
pub(crate) fn send_mss(_socket: &TcpStream) -> Option<usize> {
    None
}

/// How much of `len` bytes of output to write now when more output is
/// ready behind them: whole segments of `mss` bytes, the rest held for the
/// next write. A write ending a little past a segment's end leaves a short
/// segment of its own once the peer's window is open (`TCP_NODELAY`), and
/// every segment costs both ends and an acknowledgement: over loopback
/// 64 KiB batches of 1 KiB frames went out as one 65 483-byte segment and
/// one of a few hundred bytes, twice raw TCP's segments and 20–30 % more
/// CPU per byte. Where `len` is under one segment, all of it.
pub(crate) fn whole_segments(len: usize, mss: usize) -> usize {
    match len - len % mss.max(1) {
        0 => len,
        whole => whole,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lowat_follows_the_rate_within_its_bounds() {
        let drain = Duration::from_millis(4);
        let max = 64 * 1024;
        // 8 Mbit/s: 4 KB in 4 ms, raised to the minimum.
        assert_eq!(lowat_for(1_000_000, drain, max), MIN_NOTSENT_LOWAT);
        // 100 Mbit/s: 50 KB.
        assert_eq!(lowat_for(12_500_000, drain, max), 50_000);
        // 1 Gbit/s and loopback: the maximum.
        assert_eq!(lowat_for(125_000_000, drain, max), max);
        assert_eq!(lowat_for(u64::MAX, drain, max), max);
        // A maximum below the minimum wins.
        assert_eq!(lowat_for(1_000_000, drain, 4096), 4096);
        assert_eq!(lowat_for(0, drain, max), MIN_NOTSENT_LOWAT);
    }

    #[test]
    fn writes_are_cut_to_whole_segments() {
        // A 64 KiB batch and the frame past its end, on a path with a 65 483-byte MSS.
        assert_eq!(whole_segments(65_536 + 1_030, 65_483), 65_483);
        assert_eq!(whole_segments(10_000, 1_448), 6 * 1_448);
        assert_eq!(whole_segments(2 * 1_448, 1_448), 2 * 1_448);
        // Under one segment: all of it (nothing would be gained by waiting).
        assert_eq!(whole_segments(1_000, 1_448), 1_000);
        assert_eq!(whole_segments(5, 0), 5);
    }

    #[tokio::test]
    async fn the_kernel_reports_a_delivery_rate_on_loopback() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (client, server) = tokio::join!(TcpStream::connect(addr), listener.accept());
        let (mut client, (mut server, _)) = (client.unwrap(), server.unwrap());
        let data = vec![7u8; 1 << 20];
        let reader = tokio::spawn(async move {
            let mut buf = vec![0u8; 1 << 16];
            let mut total = 0;
            while total < 1 << 20 {
                total += server.read(&mut buf).await.unwrap();
            }
        });
        client.write_all(&data).await.unwrap();
        reader.await.unwrap();
        let rate = delivery_rate(&client);
        if cfg!(target_os = "linux") {
            assert!(rate.is_some_and(|r| r > 0), "rate {rate:?}");
        }
        // A lowat set on the socket is the one the rate calls for: on a
        // fast loopback the maximum stays (no change); with a maximum of
        // 1 MiB and a drain time of a microsecond, the rate sets it low.
        let mut lowat = AdaptiveLowat::new(Duration::from_millis(4), 64 * 1024);
        let fast = lowat.update(Instant::now(), &client);
        assert!(fast.is_none_or(|l| l >= MIN_NOTSENT_LOWAT), "{fast:?}");
        let mut lowat = AdaptiveLowat::new(Duration::from_nanos(1), 1 << 20);
        if let Some(r) = rate {
            let set = lowat.update(Instant::now(), &client);
            assert_eq!(set, Some(lowat_for(r, Duration::from_nanos(1), 1 << 20)));
            assert_eq!(set, Some(MIN_NOTSENT_LOWAT));
            let got = socket2::SockRef::from(&client).tcp_notsent_lowat().unwrap();
            assert_eq!(got, MIN_NOTSENT_LOWAT);
            // Checked again only after `CHECK_EVERY`.
            assert_eq!(lowat.update(Instant::now(), &client), None);
        }
    }
}
