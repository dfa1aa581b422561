mod common;
mod interop;
