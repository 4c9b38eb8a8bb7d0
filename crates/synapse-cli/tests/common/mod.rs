//! Helpers of the command-line tests that drive `synapse-cli serve` over HTTP (also used by
//! the top-level `tests/cluster.rs`).

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::Child;

use serde_json::Value;

/// `synapse-cli importance` of `model` on `text` with the tests' small settings (its first
/// 256 tokens in sessions of 32, 64 rows per site, one chunk per KL-weight ablation).
pub fn importance_args<'a>(model: &'a str, text: &'a str) -> [&'a str; 13] {
    [
        "importance",
        "-m",
        model,
        "--calib",
        text,
        "--tokens",
        "256",
        "--ctx",
        "32",
        "--rows",
        "64",
        "--kl-chunks",
        "1",
    ]
}

/// One HTTP/1.1 request on its own connection: (status, body as JSON or as a string).
pub fn http(addr: &str, method: &str, path: &str, body: &str) -> (u16, Value) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(300)))
        .unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).unwrap();
    let status: u16 = raw[9..12].parse().unwrap();
    let (_, rest) = raw.split_once("\r\n\r\n").unwrap();
    // A JSON answer (chunked or not) lies between the first `{` and the last `}`; anything
    // else (the Prometheus text) comes back as a string.
    let json = raw
        .to_ascii_lowercase()
        .contains("content-type: application/json");
    let body = match (json, rest.find('{'), rest.rfind('}')) {
        (true, Some(a), Some(b)) => serde_json::from_str(&rest[a..=b]).unwrap_or(Value::Null),
        _ => Value::String(rest.to_string()),
    };
    (status, body)
}

pub struct Server(pub Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Server {
    /// Waits for a spawned `serve` (stderr piped) to print `listening on http://ADDR`:
    /// the server, its address and the stderr lines before that one. Later stderr is drained
    /// in the background (a full pipe would stall the server).
    pub fn started(mut child: Child) -> (Server, String, Vec<String>) {
        let stderr = child.stderr.take().expect("stderr piped");
        let server = Server(child);
        let mut lines = BufReader::new(stderr).lines();
        let mut before = Vec::new();
        let mut addr = String::new();
        for line in lines.by_ref() {
            let line = line.unwrap();
            if let Some(a) = line.strip_prefix("listening on http://") {
                addr = a.trim().to_string();
                break;
            }
            before.push(line);
        }
        assert!(
            !addr.is_empty(),
            "the server did not start:\n{}",
            before.join("\n")
        );
        std::thread::spawn(move || for _ in lines {});
        (server, addr, before)
    }

    /// A byte count of the server's `/proc/<pid>/status` (`VmRSS:`, `VmHWM:`).
    pub fn status_bytes(&self, field: &str) -> u64 {
        std::fs::read_to_string(format!("/proc/{}/status", self.0.id()))
            .unwrap()
            .lines()
            .find(|l| l.starts_with(field))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap()
            * 1024
    }
}
