//! `GET /v1/attachments` is paged: a bounded number of attachments and of
//! bytes per answer, in cache file name order, every attachment reachable
//! through `next`, and the daemon's memory bounded by a page, not by the
//! cache.
//!
//! Regression test (before: 20 cached 15 MB results
//! gave one 301 MB answer; the daemon's RSS reached 769 MB and stayed at
//! 692 MB).

use std::collections::BTreeSet;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::support::daemon::{Daemon, Dirs, get};
use cnid::api::{ATTACHMENTS_PAGE_BYTES, ATTACHMENTS_PAGE_DEFAULT, ATTACHMENTS_PAGE_MAX};
use serde_json::Value;

const CONFIG: &str = r#"{"cniVersion":"1.0.0","name":"NET","plugins":[{"type":"noop"}]}"#;

/// Writes a `cniCacheV1` record as cnid (and libcni) would, with `result`
/// as given (raw JSON).
fn write_record(cache: &Path, network: &str, cid: &str, ifname: &str, result: &str) -> String {
    use base64::Engine as _;
    let name = cni_core::cache::file_name(network, cid, ifname).unwrap();
    let dir = cache.join("results");
    std::fs::create_dir_all(&dir).unwrap();
    let config = base64::engine::general_purpose::STANDARD.encode(CONFIG.replace("NET", network));
    std::fs::write(
        dir.join(&name),
        format!(
            r#"{{"kind":"cniCacheV1","containerId":"{cid}","config":"{config}","ifName":"{ifname}","networkName":"{network}","netns":"/run/netns/{cid}","result":{result}}}"#
        ),
    )
    .unwrap();
    name
}

fn status_kib(pid: i32, key: &str) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("daemon status");
    s.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no {key} in /proc/{pid}/status"))
}

/// Every page from `first_query` on, following `next`: (page sizes in
/// attachments, page sizes in bytes, every attachment as
/// `network/container/ifname`).
fn page_through(
    socket: &Path,
    query: &str,
    limit: Option<usize>,
) -> (Vec<usize>, Vec<usize>, Vec<String>) {
    let (mut counts, mut sizes, mut all) = (Vec::new(), Vec::new(), Vec::new());
    let mut after: Option<String> = None;
    loop {
        let mut params: Vec<String> = Vec::new();
        if !query.is_empty() {
            params.push(query.to_owned());
        }
        if let Some(l) = limit {
            params.push(format!("limit={l}"));
        }
        if let Some(a) = &after {
            params.push(format!("after={a}"));
        }
        let path = if params.is_empty() {
            "/v1/attachments".to_owned()
        } else {
            format!("/v1/attachments?{}", params.join("&"))
        };
        let r = get(socket, &path);
        assert_eq!(
            r.status,
            200,
            "{path}: {}",
            String::from_utf8_lossy(&r.body)
        );
        sizes.push(r.body.len());
        let v = r.json();
        let obj = v.as_object().unwrap();
        assert!(
            obj.keys().all(|k| k == "attachments" || k == "next"),
            "page keys: {:?}",
            obj.keys().collect::<Vec<_>>()
        );
        let page = v["attachments"].as_array().unwrap();
        counts.push(page.len());
        for a in page {
            all.push(format!(
                "{}/{}/{}",
                a["network"].as_str().unwrap(),
                a["containerId"].as_str().unwrap(),
                a["ifname"].as_str().unwrap()
            ));
        }
        match v.get("next").and_then(Value::as_str) {
            Some(n) => {
                assert!(after.as_deref().is_none_or(|a| n > a), "next went back");
                after = Some(n.to_owned());
            }
            None => return (counts, sizes, all),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_attachments_are_paged_and_every_one_is_reachable() {
    let dirs = Dirs::new();
    let mut names = Vec::new();
    let mut want = Vec::new();
    for net in ["net-a", "netb", "z"] {
        for c in 0..90 {
            let cid = format!("c{c:03}");
            for ifname in ["eth0", "net1"] {
                if (c + ifname.len()) % 3 == 0 {
                    continue;
                }
                names.push(write_record(
                    &dirs.cache,
                    net,
                    &cid,
                    ifname,
                    r#"{"cniVersion":"1.0.0"}"#,
                ));
                want.push((
                    names.last().unwrap().clone(),
                    format!("{net}/{cid}/{ifname}"),
                ));
            }
        }
    }
    want.sort();
    let want: Vec<String> = want.into_iter().map(|(_, a)| a).collect();
    let total = want.len();
    assert!(total > ATTACHMENTS_PAGE_DEFAULT * 3);
    let daemon = Daemon::start(&dirs, &[]);
    let s = &daemon.socket;

    // Without parameters: the default page, and where to go on.
    let (counts, _, all) = page_through(s, "", None);
    assert_eq!(counts[0], ATTACHMENTS_PAGE_DEFAULT);
    assert_eq!(
        all, want,
        "default pages: every attachment once, in file name order"
    );
    // Small pages: the same, 7 at a time.
    let (counts, _, all) = page_through(s, "", Some(7));
    assert!(counts.iter().all(|&n| n <= 7));
    assert_eq!(all, want, "pages of 7");
    assert_eq!(counts.len(), total.div_ceil(7));
    // One container's, paged.
    let (_, _, mine) = page_through(s, "containerId=c042", Some(1));
    let want_mine: Vec<String> = want
        .iter()
        .filter(|a| a.contains("/c042/"))
        .cloned()
        .collect();
    assert!(!want_mine.is_empty());
    assert_eq!(mine, want_mine);
    // The typed client pages through everything.
    let client = daemon.client().await;
    let typed: Vec<String> = client
        .attachments(None)
        .await
        .unwrap()
        .iter()
        .map(|a| format!("{}/{}/{}", a.network, a.container_id, a.ifname))
        .collect();
    assert_eq!(typed, want, "Client::attachments");
    let page = client
        .attachments_page(None, None, Some(ATTACHMENTS_PAGE_MAX))
        .await
        .unwrap();
    assert_eq!(page.attachments.len(), total.min(ATTACHMENTS_PAGE_MAX));

    // A page stays right when attachments come and go between requests:
    // those present throughout are listed exactly once.
    let first = client.attachments_page(None, None, Some(50)).await.unwrap();
    let next = first.next.clone().unwrap();
    std::fs::remove_file(dirs.cache.join("results").join(&names[10])).unwrap();
    write_record(
        &dirs.cache,
        "net-a",
        "a000",
        "eth0",
        r#"{"cniVersion":"1.0.0"}"#,
    );
    let mut seen: Vec<String> = first
        .attachments
        .iter()
        .map(|a| format!("{}/{}/{}", a.network, a.container_id, a.ifname))
        .collect();
    let mut after = Some(next);
    while let Some(a) = after.take() {
        let p = client
            .attachments_page(None, Some(&a), Some(50))
            .await
            .unwrap();
        seen.extend(
            p.attachments
                .iter()
                .map(|a| format!("{}/{}/{}", a.network, a.container_id, a.ifname)),
        );
        after = p.next;
    }
    let unique: BTreeSet<&String> = seen.iter().collect();
    assert_eq!(unique.len(), seen.len(), "an attachment listed twice");
    assert_eq!(
        seen.len(),
        total,
        "one removed after its page, one added before the pages read"
    );

    // Bad parameters are refused.
    for (q, what) in [
        ("limit=0", "limit 0"),
        (
            &*format!("limit={}", ATTACHMENTS_PAGE_MAX + 1),
            "limit over the maximum",
        ),
        ("limit=x", "limit not a number"),
        ("after=", "empty after"),
        ("after=..%2Fx", "after with a slash"),
        ("page=2", "unknown parameter"),
    ] {
        let r = get(s, &format!("/v1/attachments?{q}"));
        assert_eq!(
            r.status,
            400,
            "{what}: {}",
            String::from_utf8_lossy(&r.body)
        );
        assert_eq!(r.cni_error(), 4, "{what}");
    }
    println!(
        "paging: {total} attachments in pages of {ATTACHMENTS_PAGE_DEFAULT} (default) and 7, one \
         container's, the typed client: each listed once in file name order; bad parameters 400"
    );
}

#[test]
fn large_cached_results_keep_each_answer_and_the_memory_bounded() {
    let dirs = Dirs::new();
    // 8 results of 4 MB each (32 MB in all), each over a page's byte bound
    // (ATTACHMENTS_PAGE_BYTES, 1 MiB), so each fills a page alone. Sized so
    // that holding them all at once (what the daemon did before paging: the
    // sum of them, several times over) is far over the bound asserted
    // below, while one at a time is far under it; 4 MB rather than the
    // 16 MiB plugin output cap keeps the debug build's JSON work (decode,
    // encode, and the test's own decode) to a few seconds (it took 100 s
    // with 15 MB results on a busy machine). Long strings: quick to decode
    // in a debug build; an object-heavy result of this size costs more
    // memory to decode, but still one record at a time.
    const RECORD_MB: u64 = 4;
    const _: () = assert!(
        RECORD_MB * 1_000_000 > ATTACHMENTS_PAGE_BYTES,
        "each record fills a page alone"
    );
    let line = "x".repeat(1_000_000);
    let big = format!(
        r#"{{"cniVersion":"1.0.0","dns":{{"search":[{}]}}}}"#,
        vec![format!("\"{line}\""); RECORD_MB as usize].join(",")
    );
    let mut want = Vec::new();
    for c in 0..8 {
        let cid = format!("big{c:02}");
        write_record(&dirs.cache, "big", &cid, "eth0", &big);
        want.push(format!("big/{cid}/eth0"));
    }
    // And a few small ones around them.
    for c in 0..5 {
        let cid = format!("small{c}");
        write_record(
            &dirs.cache,
            "big",
            &cid,
            "eth0",
            r#"{"cniVersion":"1.0.0"}"#,
        );
        want.push(format!("big/{cid}/eth0"));
    }
    want.sort();
    drop(big);
    let daemon = Daemon::start(&dirs, &[]);
    let pid = daemon.pid();
    let rss_idle = status_kib(pid, "VmRSS");
    let t = Instant::now();
    let (counts, sizes, all) = page_through(&daemon.socket, "", Some(ATTACHMENTS_PAGE_MAX));
    let took = t.elapsed();
    assert_eq!(all, want, "every attachment once, in order");
    let hwm = status_kib(pid, "VmHWM");
    let rss_done = status_kib(pid, "VmRSS");
    // Freed memory goes back to the system (the daemon trims its heap
    // within a second or so after a large answer): to within half a record
    // of the idle RSS (it was within 0.1 MiB with 15 MB results).
    let given_back = rss_idle + RECORD_MB * 1_000_000 / 1024 / 2;
    let mut rss_after = rss_done;
    let back = Instant::now();
    while rss_after > given_back && back.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(50));
        rss_after = status_kib(pid, "VmRSS");
    }
    let largest = sizes.iter().max().copied().unwrap_or(0);
    let mib = |k: u64| k as f64 / 1024.0;
    println!(
        "paging: 8 cached results of {RECORD_MB} MB and 5 small ones: {} pages in {:.1} s, at most {} \
         attachments and {:.1} MiB per answer; daemon RSS idle {:.1} MiB, peak (VmHWM) {:.1} MiB, \
         after the last page {:.1} MiB, {:.0} ms later {:.1} MiB",
        counts.len(),
        took.as_secs_f64(),
        counts.iter().max().unwrap(),
        largest as f64 / 1048576.0,
        mib(rss_idle),
        mib(hwm),
        mib(rss_done),
        back.elapsed().as_secs_f64() * 1000.0,
        mib(rss_after),
    );
    // A page holds one large result at most (it alone is over the byte
    // bound of a page).
    let record = RECORD_MB * 1_000_000;
    assert!(
        (largest as u64) < 2 * record,
        "an answer of {largest} bytes holds more than one {RECORD_MB} MB result"
    );
    assert!(
        counts.len() >= 8,
        "{} pages for 8 large results",
        counts.len()
    );
    // One record read, decoded and encoded at a time: a few times one
    // record over the idle RSS, whatever the number of records (before:
    // the sum of them, 32 MB, several times over).
    let bound = rss_idle + 6 * record / 1024;
    assert!(
        hwm < bound,
        "peak RSS {:.1} MiB, over idle {:.1} MiB + 6 records",
        mib(hwm),
        mib(rss_idle)
    );
    assert!(
        rss_after <= given_back,
        "memory not given back: {:.1} MiB (idle {:.1} MiB)",
        mib(rss_after),
        mib(rss_idle)
    );
}
