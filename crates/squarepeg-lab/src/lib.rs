//! squarepeg-lab (docs to come)

pub mod checksum;
pub mod middlebox;
pub mod model;
pub mod packet;
pub mod pcap;
pub mod rng;
pub mod sim;
pub mod units;

use serde::{Deserialize, Serialize};

/// The direction a packet crosses the lab's dumbbell.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Direction {
    /// From the left hosts to the right hosts.
    LeftToRight,
    /// From the right hosts to the left hosts.
    RightToLeft,
}

impl Direction {
    /// The other direction.
    pub fn reverse(self) -> Self {
        match self {
            Direction::LeftToRight => Direction::RightToLeft,
            Direction::RightToLeft => Direction::LeftToRight,
        }
    }

    /// 0 for left to right, 1 for right to left.
    pub fn index(self) -> usize {
        match self {
            Direction::LeftToRight => 0,
            Direction::RightToLeft => 1,
        }
    }
}

/// A side of the dumbbell.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Side {
    /// The left (by convention the client or home) side.
    Left,
    /// The right (by convention the server or Internet) side.
    Right,
}

impl Side {
    /// The direction of packets leaving this side.
    pub fn outgoing(self) -> Direction {
        match self {
            Side::Left => Direction::LeftToRight,
            Side::Right => Direction::RightToLeft,
        }
    }

    /// 0 for left, 1 for right.
    pub fn index(self) -> usize {
        match self {
            Side::Left => 0,
            Side::Right => 1,
        }
    }
}
