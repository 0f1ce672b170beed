//! A lab for interoperability tests: a network namespace of the test's own (unique name with
//! the process id, removed on drop even when the test fails) holding a TUN device that a
//! squarepeg [`Stack`] drives, with the kernel's TCP as the peer inside the same namespace.

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::{RngCore, SeedableRng};
use sha2::{Digest, Sha256};
use socket2::{Domain, Protocol, Socket, Type};
use squarepeg_io::{
    CloseReason, ConnectionStats, HostSetup, Impairment, InterfaceCounters, Offload, Stack,
    StackConfig, StackStats, TcpStream, TunConfig, TunDevice,
};
use squarepeg_lab::net::NetNs;
use squarepeg_lab::stack::pcap_capture;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The device name inside each test's namespace (namespaces keep tests apart).
pub const DEVICE: &str = "sp0";

/// Whether the machine lets this test build namespaces and TUN devices; prints why not.
pub use squarepeg_lab::stack::can_run;

static COUNTER: AtomicUsize = AtomicUsize::new(0);

/// A name unique to this process and call.
pub fn unique(tag: &str) -> String {
    format!(
        "spio-{tag}-{}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

/// A directory removed on drop unless the test panicked or `SPIO_KEEP` is set (then its path
/// is printed, so that captures can be looked at).
pub struct ScratchDir(pub PathBuf);

impl ScratchDir {
    pub fn new(tag: &str) -> Self {
        let p = std::env::temp_dir().join(unique(tag));
        std::fs::create_dir_all(&p).unwrap();
        ScratchDir(p)
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        if std::thread::panicking() || std::env::var_os("SPIO_KEEP").is_some() {
            eprintln!("kept {} for inspection", self.0.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// What a lab looks like.
#[derive(Debug)]
pub struct LabOptions {
    pub mtu: u16,
    /// MSS both ends advertise (the kernel's by TCP_MAXSEG); `None` derives it from the MTU.
    pub mss: Option<u16>,
    pub impairment: Option<Impairment>,
    /// Capture file and snapshot length.
    pub capture: Option<(PathBuf, u32)>,
    /// The device's transmit queue (kernel to squarepeg), in packets.
    pub tx_queue_len: Option<u32>,
    /// Answer every SYN with a SYN cookie (RFC 4987 §3.6).
    pub syn_cookies_always: bool,
    /// TUN offloads; `SPIO_OFFLOAD=off|on|auto` overrides the default (auto).
    pub offload: Offload,
}

/// The offload mode of `SPIO_OFFLOAD` (auto when unset).
pub fn offload_from_env() -> Offload {
    match std::env::var("SPIO_OFFLOAD").as_deref() {
        Ok("off") => Offload::Off,
        Ok("on") => Offload::On,
        _ => Offload::Auto,
    }
}

impl Default for LabOptions {
    fn default() -> Self {
        LabOptions {
            mtu: 1500,
            mss: None,
            impairment: None,
            capture: None,
            tx_queue_len: std::env::var("SPIO_TXQ").ok().and_then(|v| v.parse().ok()),
            syn_cookies_always: false,
            offload: offload_from_env(),
        }
    }
}

/// A namespace with a TUN device, the kernel's addresses on it and a stack behind it. Fields
/// drop in order: the stack (and its device) before the namespace.
pub struct Lab {
    pub stack: Stack,
    pub setup: HostSetup,
    /// The MSS both ends advertise (`LabOptions::mss`).
    pub mss: Option<u16>,
    pub ns: NetNs,
}

impl Lab {
    pub fn start(tag: &str, options: LabOptions) -> Lab {
        let ns = NetNs::create(&unique(tag)).expect("create namespace");
        let mut tun = TunConfig::default();
        tun.name = Some(DEVICE.into());
        tun.mtu = Some(options.mtu);
        tun.tx_queue_len = options.tx_queue_len;
        tun.offload = options.offload;
        let device = ns
            .run(|| TunDevice::open(&tun))
            .expect("join namespace")
            .expect("open TUN");
        let mut setup = HostSetup::lab(DEVICE);
        setup.netns = Some(ns.name().to_string());
        setup.apply().expect("configure addresses");
        let mut config = StackConfig::new(setup.stack_addresses());
        config.connection.mss = options.mss;
        if options.syn_cookies_always {
            config.endpoint.syn_cookies = squarepeg_tcp::SynCookies::Always;
        }
        config.impairment = options.impairment;
        if let Some((path, snaplen)) = &options.capture {
            config.capture = Some(pcap_capture(path, *snaplen).expect("capture file"));
        }
        let stack = Stack::new(device, config).expect("start stack");
        Lab {
            stack,
            setup,
            mss: options.mss,
            ns,
        }
    }

    /// The kernel's address of a family.
    pub fn kernel_addr(&self, v6: bool) -> IpAddr {
        self.setup
            .pairs
            .iter()
            .find(|p| p.kernel.is_ipv6() == v6)
            .unwrap()
            .kernel
    }

    /// The stack's address of a family.
    pub fn stack_addr(&self, v6: bool) -> IpAddr {
        self.setup
            .pairs
            .iter()
            .find(|p| p.stack.is_ipv6() == v6)
            .unwrap()
            .stack
    }

    /// A kernel TCP socket in the lab's namespace, with the lab's MSS.
    fn kernel_socket(&self, v6: bool) -> Socket {
        let domain = if v6 { Domain::IPV6 } else { Domain::IPV4 };
        let s = self
            .ns
            .run(|| Socket::new(domain, Type::STREAM, Some(Protocol::TCP)))
            .unwrap()
            .expect("kernel socket");
        if let Some(mss) = self.mss {
            s.set_tcp_mss(u32::from(mss)).expect("TCP_MAXSEG");
        }
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        s.set_write_timeout(Some(Duration::from_secs(60))).unwrap();
        s
    }

    /// A kernel listener on the kernel's address.
    pub fn kernel_listen(&self, v6: bool, port: u16) -> std::net::TcpListener {
        let s = self.kernel_socket(v6);
        s.set_reuse_address(true).unwrap();
        s.bind(&SocketAddr::new(self.kernel_addr(v6), port).into())
            .expect("bind in namespace");
        s.listen(16).unwrap();
        s.into()
    }

    /// A kernel client connected to `to`.
    pub fn kernel_connect(&self, to: SocketAddr) -> std::net::TcpStream {
        let s = self.kernel_socket(to.is_ipv6());
        s.connect_timeout(&to.into(), Duration::from_secs(30))
            .expect("kernel connect to the stack");
        let stream: std::net::TcpStream = s.into();
        stream
            .set_read_timeout(Some(Duration::from_secs(60)))
            .unwrap();
        stream
    }

    /// The device's counters as the kernel sees them.
    pub fn device_counters(&self) -> InterfaceCounters {
        self.ns
            .run(|| InterfaceCounters::read(DEVICE))
            .unwrap()
            .expect("device counters")
    }

    /// Stops the stack and returns its counters.
    pub fn finish(self) -> StackStats {
        let Lab { stack, ns, .. } = self;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let stats = rt
            .block_on(stack.shutdown())
            .expect("driver ran without error");
        drop(ns);
        stats
    }
}

/// The pseudo-random bytes a peer sends: a ChaCha8 keystream of the seed.
pub struct Pattern(ChaCha8Rng);

impl Pattern {
    pub fn new(seed: u64) -> Self {
        Pattern(ChaCha8Rng::seed_from_u64(seed))
    }
    pub fn fill(&mut self, buf: &mut [u8]) {
        self.0.fill_bytes(buf);
    }

    /// SHA-256 of the first `bytes` of the seed's pattern.
    pub fn digest_of(bytes: u64, seed: u64) -> [u8; 32] {
        let mut p = Pattern::new(seed);
        let mut hash = Sha256::new();
        let mut buf = vec![0u8; CHUNK];
        let mut left = bytes;
        while left > 0 {
            let n = left.min(CHUNK as u64) as usize;
            p.fill(&mut buf[..n]);
            hash.update(&buf[..n]);
            left -= n as u64;
        }
        hash.finalize().into()
    }
}

/// What one end of a bidirectional transfer saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exchange {
    pub sent: u64,
    pub sent_digest: [u8; 32],
    pub received: u64,
    pub received_digest: [u8; 32],
}

const CHUNK: usize = 64 << 10;

/// The kernel's end: sends `send` bytes of `seed`'s pattern then FIN, while reading to the
/// peer's FIN; then closes.
pub fn kernel_exchange(stream: std::net::TcpStream, send: u64, seed: u64) -> Exchange {
    let mut writer = stream.try_clone().unwrap();
    let sender = std::thread::spawn(move || {
        let mut pattern = Pattern::new(seed);
        let mut hash = Sha256::new();
        let mut buf = vec![0u8; CHUNK];
        let mut left = send;
        while left > 0 {
            let n = left.min(CHUNK as u64) as usize;
            pattern.fill(&mut buf[..n]);
            hash.update(&buf[..n]);
            writer.write_all(&buf[..n]).expect("kernel write");
            left -= n as u64;
        }
        writer.shutdown(std::net::Shutdown::Write).unwrap();
        <[u8; 32]>::from(hash.finalize())
    });
    let mut reader = stream;
    let mut hash = Sha256::new();
    let mut buf = vec![0u8; CHUNK];
    let mut received = 0u64;
    loop {
        let n = reader.read(&mut buf).expect("kernel read");
        if n == 0 {
            break;
        }
        hash.update(&buf[..n]);
        received += n as u64;
    }
    let sent_digest = sender.join().expect("kernel sender");
    drop(reader);
    Exchange {
        sent: send,
        sent_digest,
        received,
        received_digest: hash.finalize().into(),
    }
}

/// The stack's end: the same, then waits until the connection has closed.
pub async fn stack_exchange(
    stream: TcpStream,
    send: u64,
    seed: u64,
) -> (Exchange, CloseReason, ConnectionStats) {
    let (mut reader, mut writer) = tokio::io::split(stream);
    let sending = async move {
        let mut pattern = Pattern::new(seed);
        let mut hash = Sha256::new();
        let mut buf = vec![0u8; CHUNK];
        let mut left = send;
        while left > 0 {
            let n = left.min(CHUNK as u64) as usize;
            pattern.fill(&mut buf[..n]);
            hash.update(&buf[..n]);
            writer.write_all(&buf[..n]).await.expect("stack write");
            left -= n as u64;
        }
        writer.shutdown().await.expect("stack shutdown");
        (writer, <[u8; 32]>::from(hash.finalize()))
    };
    let receiving = async move {
        let mut hash = Sha256::new();
        let mut buf = vec![0u8; CHUNK];
        let mut received = 0u64;
        loop {
            let n = reader.read(&mut buf).await.expect("stack read");
            if n == 0 {
                break;
            }
            hash.update(&buf[..n]);
            received += n as u64;
        }
        (reader, received, <[u8; 32]>::from(hash.finalize()))
    };
    let ((writer, sent_digest), (reader, received, received_digest)) =
        tokio::join!(sending, receiving);
    let stream = reader.unsplit(writer);
    let reason = stream.wait_closed().await.expect("wait_closed");
    let stats = stream.stats().expect("stats");
    (
        Exchange {
            sent: send,
            sent_digest,
            received,
            received_digest,
        },
        reason,
        stats,
    )
}

/// TCP flags seen in a capture, by direction.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct FlagCounts {
    /// Index 0: sent by the kernel; 1: sent by the stack.
    pub syn: [u64; 2],
    pub syn_ack: [u64; 2],
    pub fin: [u64; 2],
    pub rst: [u64; 2],
    pub packets: [u64; 2],
}

/// Reads a capture (possibly cut to a snapshot length) and counts TCP flags per direction.
pub fn flags_in_capture(path: &Path, stack_addrs: &[IpAddr]) -> FlagCounts {
    let bytes = std::fs::read(path).expect("read capture");
    let file = squarepeg_lab::pcap::read_pcap(&bytes).expect("a pcap file");
    let mut counts = FlagCounts::default();
    for r in &file.records {
        let p = &r.data;
        let Some((src, tcp)) = tcp_offset(p) else {
            continue;
        };
        let Some(&flags) = p.get(tcp + 13) else {
            continue;
        };
        let dir = usize::from(stack_addrs.contains(&src));
        counts.packets[dir] += 1;
        let (fin, syn, rst, ack) = (
            flags & 0x01 != 0,
            flags & 0x02 != 0,
            flags & 0x04 != 0,
            flags & 0x10 != 0,
        );
        if syn && ack {
            counts.syn_ack[dir] += 1;
        } else if syn {
            counts.syn[dir] += 1;
        }
        if fin {
            counts.fin[dir] += 1;
        }
        if rst {
            counts.rst[dir] += 1;
        }
    }
    counts
}

/// Source address and TCP header offset of a TCP packet (no IPv6 extension headers).
fn tcp_offset(p: &[u8]) -> Option<(IpAddr, usize)> {
    match p.first()? >> 4 {
        4 if p.len() >= 20 && p[9] == 6 => {
            let src: [u8; 4] = p[12..16].try_into().ok()?;
            Some((IpAddr::from(src), usize::from(p[0] & 0x0f) * 4))
        }
        6 if p.len() >= 40 && p[6] == 6 => {
            let src: [u8; 16] = p[8..24].try_into().ok()?;
            Some((IpAddr::from(src), 40))
        }
        _ => None,
    }
}

/// A runtime for the stack's side of a test.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}
