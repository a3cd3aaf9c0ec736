//! A2A for the mesh: an agent's Agent Card becomes its capabilities
//! ([`card`]), the executor sends messages to A2A agents and waits for
//! their tasks ([`client`]), and the gateway answers A2A callers in the
//! wire shapes of [`wire`] — in protocol 1.0 and in 0.3.

pub mod card;
pub mod client;
pub mod wire;

pub use card::{Card, CardError, Interface};
pub use client::{CallError, Ending, Outcome};
pub use wire::{Event, State, Task, Version};
