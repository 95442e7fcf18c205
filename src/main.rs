fn main() -> anyhow::Result<()> {
    cdnmap_ops::run()
}
