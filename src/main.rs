//! The `cdnmap` binary: see `cdnmap --help`.

#[global_allocator]
static ALLOC: cdnmap_ops::alloc::Counting = cdnmap_ops::alloc::Counting;

fn main() -> std::process::ExitCode {
    cdnmap_ops::main()
}
