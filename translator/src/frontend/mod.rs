//! The front end: guest bytes decoded and lifted to the IR.

pub mod decode;
