#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| sessions_mcp_fuzz::entry::jsonrpc(data));
