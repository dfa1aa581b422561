
mod client;
