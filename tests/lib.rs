//! End-to-end test support: building guest samples and running them natively and under hotpath.
