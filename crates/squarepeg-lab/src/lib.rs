//! The test network: a link impairment model driving a deterministic simulator and a userspace emulator between network namespaces, with middlebox behaviours
