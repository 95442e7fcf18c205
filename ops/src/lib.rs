//! The operator's command line.
pub fn run() -> anyhow::Result<()> {
    Ok(())
}
