//! The runtime, the top layer: the dispatcher (which uses every folder below) and the
//! instructions it carries out itself instead of running them translated.

pub(crate) mod dispatch;
pub(crate) mod special;
