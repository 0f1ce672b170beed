//! Packet I/O drivers for the userspace TCP: TUN device, event loop and timers
