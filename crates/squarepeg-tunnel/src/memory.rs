//! A packet device made of channels, for tests and simulations: the tunnel reads what the
//! [`MemoryHost`] injects and the host receives what the tunnel writes.

use std::io;

use tokio::sync::{Mutex, mpsc};

use crate::forward::PacketIo;

/// The tunnel's end of a channel device.
#[derive(Debug)]
pub struct MemoryDevice {
    from_host: Mutex<mpsc::Receiver<Vec<u8>>>,
    to_host: mpsc::Sender<Vec<u8>>,
}

/// The host's end: what the kernel's side of a TUN device would be.
#[derive(Debug)]
pub struct MemoryHost {
    /// Packets into the tunnel.
    pub to_tunnel: mpsc::Sender<Vec<u8>>,
    /// Packets out of the tunnel.
    pub from_tunnel: mpsc::Receiver<Vec<u8>>,
}

/// A channel device holding at most `capacity` packets each way.
pub fn memory_device(capacity: usize) -> (MemoryDevice, MemoryHost) {
    let (to_tunnel, from_host) = mpsc::channel(capacity);
    let (to_host, from_tunnel) = mpsc::channel(capacity);
    (
        MemoryDevice {
            from_host: Mutex::new(from_host),
            to_host,
        },
        MemoryHost {
            to_tunnel,
            from_tunnel,
        },
    )
}

impl PacketIo for MemoryDevice {
    async fn recv(&self, buf: &mut [u8]) -> io::Result<usize> {
        let packet =
            self.from_host.lock().await.recv().await.ok_or_else(|| {
                io::Error::new(io::ErrorKind::BrokenPipe, "the host side is gone")
            })?;
        // As a TUN device does: a packet longer than the buffer is cut.
        let n = packet.len().min(buf.len());
        buf[..n].copy_from_slice(&packet[..n]);
        Ok(n)
    }

    async fn send(&self, packet: &[u8]) -> io::Result<()> {
        self.to_host
            .send(packet.to_vec())
            .await
            .map_err(|_| io::Error::new(io::ErrorKind::BrokenPipe, "the host side is gone"))
    }
}
