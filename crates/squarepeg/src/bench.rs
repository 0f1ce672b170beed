//! Message-throughput measurements over loopback, shared by the criterion
//! bench (`cargo bench -p squarepeg`) and `peg bench messages`, so both
//! report the same thing.
//!
//! Each run moves `count` messages of `size` bytes from a client to a server
//! over a fresh loopback connection and returns the time from the first send
//! to the last receive. The baseline is plain tokio TCP carrying the same
//! payload bytes as length-prefixed records (4-byte big-endian length, then
//! the payload), as a careful application would: written through a
//! `BufWriter` as large as squarepeg's write batch, read into a `BytesMut`
//! in reads as large as squarepeg's, each record handed out as a `Bytes`
//! slice of the read buffer (no copy, no allocation per record), just as
//! squarepeg hands out its payloads. Both contenders run the same layout:
//! the sender in a spawned task, the receiver in the caller's task, the
//! same payload (one shared `Bytes`) sent each time.

use std::time::{Duration, Instant};

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufWriter};
use tokio::net::{TcpListener, TcpStream};

use crate::{Connection, ConnectionConfig, Endpoint, MessageProps};

/// Result of one measurement.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub struct Measurement {
    pub size: usize,
    pub count: usize,
    pub elapsed: Duration,
    /// CPU time of the whole process (user + system) during the run: both ends run in this
    /// process, so this is what the transfer cost, steadier than `elapsed` on a busy machine.
    pub cpu: Duration,
}

/// CPU time (user + system) this process has used so far: all its threads, so both ends of a
/// loopback transfer run in the process count.
pub fn process_cpu() -> Duration {
    // SAFETY: getrusage only writes the struct it is given; all-zero is a valid rusage.
    let u = unsafe {
        let mut u: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut u);
        u
    };
    let tv = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64)
    };
    tv(u.ru_utime) + tv(u.ru_stime)
}

impl Measurement {
    /// CPU nanoseconds per payload byte.
    pub fn cpu_ns_per_byte(&self) -> f64 {
        self.cpu.as_nanos() as f64 / (self.size * self.count) as f64
    }

    /// Payload bytes per second.
    pub fn bytes_per_sec(&self) -> f64 {
        (self.size * self.count) as f64 / self.elapsed.as_secs_f64()
    }

    /// Messages per second.
    pub fn messages_per_sec(&self) -> f64 {
        self.count as f64 / self.elapsed.as_secs_f64()
    }
}

/// `count` messages of `size` bytes through squarepeg over kernel TCP.
pub async fn squarepeg_messages(
    size: usize,
    count: usize,
    config: ConnectionConfig,
) -> std::io::Result<Measurement> {
    let ep = Endpoint::bind("127.0.0.1:0", config.clone())
        .await
        .map_err(std::io::Error::other)?;
    let addr = ep.local_addr()?;
    let (client, server) = tokio::join!(Connection::connect(addr, config), ep.accept());
    let client = client.map_err(std::io::Error::other)?;
    let server = server.map_err(std::io::Error::other)?;
    let payload = Bytes::from(vec![0x5au8; size]);
    // One message each way first: both ends have the other's PARAMS, so both write plain
    // frames from the first measured message on (docs/wire.md §3) — the figures are the
    // steady state's, not a mix that depends on how much was queued before the switch.
    for (from, to) in [(&client, &server), (&server, &client)] {
        from.send_message(Bytes::from_static(b"warm-up"), MessageProps::default())
            .await
            .map_err(std::io::Error::other)?;
        to.recv_message().await.map_err(std::io::Error::other)?;
    }
    let cpu = process_cpu();
    let start = Instant::now();
    let sender = tokio::spawn(async move {
        for _ in 0..count {
            client
                .send_message(payload.clone(), MessageProps::default())
                .await
                .map_err(std::io::Error::other)?;
        }
        Ok::<_, std::io::Error>(client)
    });
    let mut bytes = 0;
    for _ in 0..count {
        let m = server.recv_message().await.map_err(std::io::Error::other)?;
        bytes += m.payload.len();
    }
    let elapsed = start.elapsed();
    let cpu = process_cpu().saturating_sub(cpu);
    let client = sender.await.map_err(std::io::Error::other)??;
    if bytes != size * count {
        return Err(std::io::Error::other("byte count mismatch"));
    }
    client.close().await;
    Ok(Measurement {
        size,
        count,
        elapsed,
        cpu,
    })
}

/// The same payload as length-prefixed records over plain tokio TCP, with
/// the write and read sizes of the default [`ConnectionConfig`].
pub async fn raw_tcp_messages(size: usize, count: usize) -> std::io::Result<Measurement> {
    raw_tcp_messages_with(size, count, &ConnectionConfig::default()).await
}

/// [`raw_tcp_messages`] with the write batch and read size of `config`, to
/// compare with squarepeg running `config`.
pub async fn raw_tcp_messages_with(
    size: usize,
    count: usize,
    config: &ConnectionConfig,
) -> std::io::Result<Measurement> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let (client, server) = tokio::join!(TcpStream::connect(addr), listener.accept());
    let client = client?;
    let (server, _) = server?;
    client.set_nodelay(true)?;
    server.set_nodelay(true)?;
    let (write_batch, read_size) = (config.write_batch, config.read_buffer);
    let payload = Bytes::from(vec![0x5au8; size]);
    let cpu = process_cpu();
    let start = Instant::now();
    let sender = tokio::spawn(async move {
        let mut w = BufWriter::with_capacity(write_batch, client);
        for _ in 0..count {
            w.write_all(&(size as u32).to_be_bytes()).await?;
            w.write_all(&payload).await?;
        }
        w.flush().await?;
        Ok::<_, std::io::Error>(w)
    });
    let mut server = server;
    let mut buf = BytesMut::with_capacity(read_size);
    let mut bytes = 0;
    let mut records = 0;
    while records < count {
        if buf.len() >= 4 {
            let len = u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
            if buf.len() >= 4 + len {
                buf.advance(4);
                let record: Bytes = buf.split_to(len).freeze();
                bytes += record.len();
                records += 1;
                continue;
            }
        }
        // Room for a full read; reclaims the buffer once the records
        // sliced from it are gone.
        buf.reserve(read_size);
        if server.read_buf(&mut buf).await? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
    }
    let elapsed = start.elapsed();
    let cpu = process_cpu().saturating_sub(cpu);
    sender.await.map_err(std::io::Error::other)??;
    if bytes != size * count {
        return Err(std::io::Error::other("byte count mismatch"));
    }
    Ok(Measurement {
        size,
        count,
        elapsed,
        cpu,
    })
}
