fn main() -> std::process::ExitCode {
    sessions_mcp::cli::main()
}
