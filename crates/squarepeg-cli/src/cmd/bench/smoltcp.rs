//! smoltcp's TCP on squarepeg's path in `peg bench tcp`: the userspace TCP over TUN is meant to
//! be ahead of smoltcp on the same path (docs/results.md).
//!
//! Same namespace layout, addresses and routes as squarepeg's rows (`HostSetup::lab`, IPv4
//! only), the same kernel peer process, the same TUN MTU and queue length, socket buffers of
//! `--buffer` bytes (smoltcp scales its window from its receive buffer), and application data
//! copied in 256 KiB pieces. smoltcp runs as shipped: its own `TunTapInterface` (one `read` or
//! `write` system call per packet, no offloads, which smoltcp does not have), its default
//! Nagle, delayed ACK and congestion control settings, and the loop its examples use: `poll`,
//! move data, then `phy::wait` on the descriptor for the interface's `poll_delay`.
//!
//! The whole transfer runs on one thread inside the namespace (smoltcp's device is not `Send`,
//! and it reads the device's MTU with an ioctl in the caller's namespace), so that thread's
//! CPU time is smoltcp's side, including the kernel's processing of every packet it writes.

use std::net::{IpAddr, SocketAddr};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail, ensure};
use indicatif::ProgressBar;
use smoltcp::iface::{Config, Interface, SocketSet};
use smoltcp::phy::{Device, Medium, TunTapInterface};
use smoltcp::socket::tcp;
use smoltcp::wire::{HardwareAddress, IpAddress, IpCidr};
use squarepeg_io::{HostSetup, InterfaceCounters};
use squarepeg_lab::net::NetNs;

use super::tcp::{
    Contender, Cpu, Direction, PeerProcess, PeerRole, Row, bytes_bar, per_gib, unique,
};
use crate::cmd::tcp::rate;

/// The TUN device's name inside the run's namespace (as squarepeg's rows).
const DEVICE: &str = "sp0";
/// The port of the listening end (the kernel's or smoltcp's), as squarepeg's rows.
const PORT: u16 = 5201;
/// smoltcp's own port when it connects (it picks none by itself).
const LOCAL_PORT: u16 = 49152;
/// Application data moves in pieces of this size, as in squarepeg's rows.
const PIECE: usize = 256 << 10;
/// The longest `phy::wait` between two checks of the stall timeout.
const TICK: smoltcp::time::Duration = smoltcp::time::Duration::from_millis(50);

/// The settings of one smoltcp run.
pub(super) struct SmoltcpRun {
    pub(super) mtu: u16,
    pub(super) bytes: u64,
    pub(super) txqueuelen: u32,
    pub(super) buffer: usize,
    /// A transfer that moves no byte and changes no TCP state for this long fails.
    pub(super) stall_timeout: Duration,
}

/// What one transfer measured.
struct Outcome {
    /// The receiver's transfer time.
    seconds: f64,
    sender_cpu: Cpu,
    receiver_cpu: Cpu,
}

pub(super) fn smoltcp_over_tun(
    run: &SmoltcpRun,
    direction: Direction,
    quiet: bool,
) -> anyhow::Result<Row> {
    let ns = NetNs::create(&unique(&format!("s{}", run.mtu)))?;
    let mut setup = HostSetup::lab(DEVICE);
    setup.netns = Some(ns.name().to_string());
    setup.pairs.truncate(1); // IPv4 only: the baseline is IPv4 too.
    // smoltcp's TunTapInterface takes the MTU the device has when it attaches, so the device
    // exists with its MTU first: a persistent one, which goes with the namespace.
    setup.create_persistent(None, Some(run.mtu))?;
    ns.ip(&[
        "link",
        "set",
        "dev",
        DEVICE,
        "txqueuelen",
        &run.txqueuelen.to_string(),
    ])?;
    let label = match direction {
        Direction::SquarepegSends => format!("smoltcp → kernel over TUN, MTU {}", run.mtu),
        Direction::SquarepegReceives => format!("kernel → smoltcp over TUN, MTU {}", run.mtu),
    };
    let bar = bytes_bar(quiet, run.bytes, label.clone());
    let outcome = ns.run(|| transfer(&ns, &setup, run, direction, &bar))?;
    bar.finish_and_clear();
    let Outcome {
        seconds,
        sender_cpu,
        receiver_cpu,
    } = outcome?;
    let drops = ns
        .run(|| InterfaceCounters::read(DEVICE))?
        .map(|c| c.tx_dropped)
        .ok();
    let bytes = run.bytes;
    if !quiet {
        eprintln!("{label}: {}", rate(bytes, seconds));
    }
    Ok(Row {
        contender: match direction {
            Direction::SquarepegSends => "smoltcp → kernel (TUN)".into(),
            Direction::SquarepegReceives => "kernel → smoltcp (TUN)".into(),
        },
        stack: Contender::Smoltcp,
        direction: Some(direction),
        mtu: run.mtu,
        bytes,
        bytes_per_second: bytes as f64 / seconds,
        sender_cpu_per_gib: per_gib(sender_cpu, bytes),
        receiver_cpu_per_gib: per_gib(receiver_cpu, bytes),
        sender_cpu,
        receiver_cpu,
        ratio_to_kernel: None,
        ratio_to_smoltcp: None,
        tun_queue_drops: drops,
        // smoltcp does not count its retransmissions.
        retransmitted_packets: None,
        seconds,
        driver_cpu: None,
        driver_busy: None,
        offload: None,
        segments_per_read: None,
        segments_per_write: None,
    })
}

/// Fails a transfer that has made no progress (bytes moved or a TCP state change) for a while,
/// so that a stall cannot hang the bench.
struct StallWatch {
    limit: Duration,
    last_progress: Instant,
    last: (u64, tcp::State),
}

impl StallWatch {
    fn new(limit: Duration) -> Self {
        StallWatch {
            limit,
            last_progress: Instant::now(),
            last: (0, tcp::State::Closed),
        }
    }

    fn check(&mut self, moved: u64, state: tcp::State, what: &str) -> anyhow::Result<()> {
        if (moved, state) != self.last {
            self.last = (moved, state);
            self.last_progress = Instant::now();
        } else if self.last_progress.elapsed() > self.limit {
            bail!(
                "smoltcp stalled: no progress for {:?} while {what} ({moved} bytes moved, TCP \
                 state {state})",
                self.limit
            );
        }
        Ok(())
    }
}

/// One transfer, on a thread inside the namespace.
fn transfer(
    ns: &NetNs,
    setup: &HostSetup,
    run: &SmoltcpRun,
    direction: Direction,
    bar: &ProgressBar,
) -> anyhow::Result<Outcome> {
    let (IpAddr::V4(kernel_ip), IpAddr::V4(stack_ip)) =
        (setup.pairs[0].kernel, setup.pairs[0].stack)
    else {
        bail!("the lab's first address pair is not IPv4");
    };
    let mut device = TunTapInterface::new(DEVICE, Medium::Ip)
        .with_context(|| format!("smoltcp: attaching to TUN device {DEVICE}"))?;
    let mtu_seen = device.capabilities().max_transmission_unit;
    ensure!(
        mtu_seen == usize::from(run.mtu),
        "smoltcp sees MTU {mtu_seen} on {DEVICE}, not {}",
        run.mtu
    );
    let mut config = Config::new(HardwareAddress::Ip);
    // Initial sequence numbers and ephemeral ports come from this seed.
    config.random_seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
        ^ u64::from(std::process::id());
    let mut iface = Interface::new(config, &mut device, smoltcp::time::Instant::now());
    let prefix = setup.pairs[0].prefix_len;
    let mut added = Ok(());
    iface.update_ip_addrs(|addrs| {
        added = addrs
            .push(IpCidr::new(IpAddress::Ipv4(stack_ip), prefix))
            .map_err(|_| anyhow!("smoltcp: no room for an address"));
    });
    added?;
    let socket = tcp::Socket::new(
        tcp::SocketBuffer::new(vec![0u8; run.buffer]),
        tcp::SocketBuffer::new(vec![0u8; run.buffer]),
    );
    let mut sockets = SocketSet::new(Vec::new());
    let handle = sockets.add(socket);
    let fd = device.as_raw_fd();
    let mut watch = StallWatch::new(run.stall_timeout);
    let bytes = run.bytes;
    // Waits for the device or the interface's next timer, at most a TICK so that the stall
    // timeout is checked.
    let wait = |delay: Option<smoltcp::time::Duration>| -> anyhow::Result<()> {
        let delay = delay.map_or(TICK, |d| d.min(TICK));
        smoltcp::phy::wait(fd, Some(delay)).context("smoltcp: waiting on the TUN device")
    };
    match direction {
        Direction::SquarepegSends => {
            let kernel = SocketAddr::new(IpAddr::V4(kernel_ip), PORT);
            let sink = PeerProcess::spawn(ns, PeerRole::Sink, kernel, bytes)?;
            let c0 = Cpu::now();
            sockets
                .get_mut::<tcp::Socket>(handle)
                .connect(
                    iface.context(),
                    (IpAddress::Ipv4(kernel_ip), PORT),
                    LOCAL_PORT,
                )
                .map_err(|e| anyhow!("smoltcp: connecting to {kernel}: {e}"))?;
            let data = vec![0u8; PIECE];
            let mut sent = 0u64;
            let mut closing = false;
            loop {
                let now = smoltcp::time::Instant::now();
                iface.poll(now, &mut device, &mut sockets);
                let s = sockets.get_mut::<tcp::Socket>(handle);
                while sent < bytes && s.can_send() {
                    let piece = (bytes - sent).min(PIECE as u64) as usize;
                    let n = s
                        .send_slice(&data[..piece])
                        .map_err(|e| anyhow!("smoltcp: sending: {e}"))?;
                    if n == 0 {
                        break;
                    }
                    sent += n as u64;
                    bar.inc(n as u64);
                }
                if sent == bytes && !closing {
                    s.close();
                    closing = true;
                }
                match s.state() {
                    // Our FIN is acknowledged and the kernel's has come: the sink has read
                    // everything.
                    tcp::State::TimeWait | tcp::State::Closed if closing => break,
                    tcp::State::Closed => bail!(
                        "smoltcp: the connection closed (refused or reset) after {sent} of \
                         {bytes} bytes"
                    ),
                    _ => {}
                }
                watch.check(sent, s.state(), "sending")?;
                wait(iface.poll_delay(now, &sockets))?;
            }
            // Send the ACK of the kernel's FIN if the last poll left it queued.
            iface.poll(smoltcp::time::Instant::now(), &mut device, &mut sockets);
            let cpu = Cpu::now().since(c0);
            let got = sink.report()?;
            ensure!(
                got.bytes == bytes,
                "the kernel sink got {} of {bytes} bytes",
                got.bytes
            );
            Ok(Outcome {
                seconds: got.seconds,
                sender_cpu: cpu,
                receiver_cpu: got.cpu,
            })
        }
        Direction::SquarepegReceives => {
            sockets
                .get_mut::<tcp::Socket>(handle)
                .listen((IpAddress::Ipv4(stack_ip), PORT))
                .map_err(|e| anyhow!("smoltcp: listening: {e}"))?;
            let ours = SocketAddr::new(IpAddr::V4(stack_ip), PORT);
            let source = PeerProcess::spawn(ns, PeerRole::Source, ours, bytes)?;
            let mut buf = vec![0u8; PIECE];
            let mut started: Option<(Instant, Cpu)> = None;
            let mut seconds = None;
            let mut total = 0u64;
            loop {
                let now = smoltcp::time::Instant::now();
                iface.poll(now, &mut device, &mut sockets);
                let s = sockets.get_mut::<tcp::Socket>(handle);
                if started.is_none() && s.state() == tcp::State::Established {
                    started = Some((Instant::now(), Cpu::now()));
                }
                while s.can_recv() {
                    let n = s
                        .recv_slice(&mut buf)
                        .map_err(|e| anyhow!("smoltcp: receiving: {e}"))?;
                    if n == 0 {
                        break;
                    }
                    total += n as u64;
                    bar.set_position(total);
                }
                if let Some((t0, _)) = started
                    && seconds.is_none()
                    && !s.may_recv()
                {
                    // The end of the stream (or a reset: the byte count tells).
                    seconds = Some(t0.elapsed().as_secs_f64());
                    s.close();
                }
                if seconds.is_some() && s.state() == tcp::State::Closed {
                    break;
                }
                watch.check(total, s.state(), "receiving")?;
                wait(iface.poll_delay(now, &sockets))?;
            }
            let (seconds, c0) = match (seconds, started) {
                (Some(seconds), Some((_, c0))) => (seconds, c0),
                _ => bail!("smoltcp: the transfer ended before it started"),
            };
            let cpu = Cpu::now().since(c0);
            let sent = source.report()?;
            ensure!(total == bytes, "smoltcp got {total} of {bytes} bytes");
            Ok(Outcome {
                seconds,
                sender_cpu: sent.cpu,
                receiver_cpu: cpu,
            })
        }
    }
}
