//! `cargo xtask ...`: developer tasks.

fn main() {
    eprintln!("usage: cargo xtask <task>");
    std::process::exit(2);
}
