//! The soak's figures, printed: the peak, the queries and their errors and latency, the table
//! a minute, the rounds, Feedback, and the memory with its verdict.

use super::*;

/// `n` with thousands separated by commas.
fn count(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Response codes and their counts, as `NOERROR 12,345, SERVFAIL 2`.
fn codes(rcodes: &[(String, u64)]) -> String {
    if rcodes.is_empty() {
        return "none".into();
    }
    let list: Vec<String> = rcodes
        .iter()
        .map(|(c, n)| format!("{c} {}", count(*n)))
        .collect();
    list.join(", ")
}

pub(super) fn print_peak(a: &SoakBenchArgs, peak: &DnsFigures) {
    println!(
        "peak: {:.0} queries/s over {} s ({}, no rate limit; NOERROR {:.2}%, lost {}, mean \
         latency {:.3} ms), the mapper running its rounds",
        peak.qps, a.peak_secs, peak.tool, peak.noerror_pct, peak.lost, peak.latency_ms
    );
}

pub(super) fn print_soak(a: &SoakBenchArgs, s: &Soaked) {
    let (r, t) = (&s.run, &s.total);
    let rate = t.answered() as f64 / s.secs.max(1e-9);
    println!(
        "soak: dnsperf -Q {} ({:.0}% of the peak) for {:.0} s, -c 8 -q 200 -v (a line per \
         query, read as it runs): {:.0} queries/s answered, {:.1}% of the rate asked",
        s.asked_qps,
        100.0 * a.load,
        s.secs,
        rate,
        100.0 * rate / s.asked_qps as f64
    );
    println!(
        "| minute | answered/s | errors | p99 latency (ms) | rounds (max ms) | cdnmap serve RSS MB \
         (max) | cdnmap dns RSS MB (max) |"
    );
    println!("|---|---|---|---|---|---|---|");
    for (i, row) in s.rows.iter().enumerate() {
        println!(
            "| {} ({:.0}-{:.0} s) | {:.0} | {} | {:.2} | {} ({:.0}) | {:.0} ({:.0}) | {:.0} \
             ({:.0}) |",
            i + 1,
            row.end_secs - row.secs,
            row.end_secs,
            row.answered as f64 / row.secs.max(1e-9),
            row.errors,
            row.p99_ms,
            row.rounds,
            row.round_max_ms,
            row.rss[0],
            row.rss_max[0],
            row.rss[1],
            row.rss_max[1]
        );
    }
    let sent = r.sent as u64;
    println!(
        "queries: sent {}, answered {} ({:.3}%), lost {}, interrupted at the end {}; response \
         codes: {}",
        count(sent),
        count(r.completed as u64),
        100.0 * r.completed / r.sent.max(1.0),
        count(r.lost as u64),
        count(t.interrupted),
        codes(&r.rcodes)
    );
    let errors = t.errors(EXPECTED_RCODE);
    println!(
        "errors: {} (lost + SERVFAIL + any code other than {EXPECTED_RCODE}; target 0: {}); \
         per-query lines read: {} answered, {} lost",
        count(errors),
        if errors == 0 { "met" } else { "NOT met" },
        count(t.answered()),
        count(t.timeouts)
    );
    let h = &t.latency;
    println!(
        "latency of the answers (from dnsperf's per-query lines): p50 {:.3} ms, p99 {:.3} ms, \
         p99.9 {:.3} ms, max {:.3} ms; dnsperf's own mean {:.3} ms, max {:.3} ms",
        h.quantile_ms(0.5),
        h.quantile_ms(0.99),
        h.quantile_ms(0.999),
        h.max_ms(),
        r.latency_ms,
        r.latency_max_ms
    );
}

/// Where the soak's CPU went, and the kernel's UDP drops.
pub(super) fn print_cpu(s: &Soaked) {
    let used: Vec<String> = s
        .cpu
        .iter()
        .map(|(name, secs)| {
            format!(
                "{name} {:.1} s ({:.2} cores)",
                secs,
                secs / s.secs.max(1e-9)
            )
        })
        .collect();
    println!(
        "CPU over the soak (/proc, the machine has {} cores): {}",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        used.join(", ")
    );
    let udp: Vec<String> = s.udp.iter().map(|(k, n)| format!("{k} +{n}")).collect();
    println!(
        "kernel UDP counters over the soak (/proc/net/snmp, the whole machine; a full socket \
         buffer drops a query before any process sees it): {}",
        if udp.is_empty() {
            "not read".to_string()
        } else {
            udp.join(", ")
        }
    );
}

pub(super) fn print_rounds(a: &SoakBenchArgs, s: &Soaked, (before, after): (&Snapshot, &Snapshot)) {
    let cycle_ms = a.cycle_secs as f64 * 1e3;
    let (median, max) = median_max(s.rounds.iter().map(RoundRec::total_ms).collect());
    let over = s.rounds.iter().filter(|r| r.total_ms() > cycle_ms).count();
    let versions = match (s.rounds.first(), s.rounds.last()) {
        (Some(f), Some(l)) => format!(" (versions {}..={})", f.version, l.version),
        _ => String::new(),
    };
    println!(
        "rounds during the soak: {} published{versions}, median {median:.0} ms, max {max:.0} ms \
         (step + publish + persist, from the mapper's log); {over} over the {} s cycle, {} \
         `round took longer than the cycle` lines",
        s.rounds.len(),
        a.cycle_secs,
        s.slow
    );
    let counter = |name| total(growth(&before.mapper, &after.mapper, name));
    println!(
        "  the mapper's /metrics over the soak: cdnmap_rounds_total +{:.0}, \
         cdnmap_rounds_slow_total +{:.0}, cdnmap_rounds_failed_total +{:.0}",
        counter("cdnmap_rounds_total"),
        counter("cdnmap_rounds_slow_total"),
        counter("cdnmap_rounds_failed_total")
    );
}

/// The sum of a counter's series (0 when it has none).
fn total(series: Vec<(String, f64)>) -> f64 {
    series.iter().fold(0.0, |sum, s| sum + s.1)
}

pub(super) fn print_feedback(before: &Snapshot, after: &Snapshot, stats: &ReportStats) {
    let mapper = |name| growth(&before.mapper, &after.mapper, name);
    let front = |name| total(growth(&before.front, &after.front, name));
    let refused = mapper("cdnmap_feedback_refused_total");
    let by_reason: Vec<String> = refused
        .iter()
        .filter(|(_, n)| *n > 0.0)
        .map(|(labels, n)| format!("{labels} {n:.0}"))
        .collect();
    let clipped = total(mapper("cdnmap_feedback_clipped_total"));
    println!(
        "feedback during the soak, the mapper's /metrics: {:.0} reports refused \
         (cdnmap_feedback_refused_total{}), {clipped:.0} samples clipped \
         (cdnmap_feedback_clipped_total); it counts no acceptances, the senders do:",
        total(refused.clone()),
        if by_reason.is_empty() {
            String::new()
        } else {
            format!(": {}", by_reason.join(", "))
        }
    );
    println!(
        "  the front end's demand reports (its /metrics): {} samples accepted \
         (cdnmap_dns_demand_samples_sent_total), {:.0} refused, {:.0} dropped",
        count(front("cdnmap_dns_demand_samples_sent_total") as u64),
        front("cdnmap_dns_demand_refused_total"),
        front("cdnmap_dns_demand_dropped_total")
    );
    println!(
        "  the bench's own calls: {} load reports ({} node loads accepted), {} demand samples \
         accepted, {} calls failed{}",
        count(after.load_reports - before.load_reports),
        count(after.loads - before.loads),
        count(after.demand_samples - before.demand_samples),
        after.failed - before.failed,
        lock(&stats.first_error)
            .as_ref()
            .map_or(String::new(), |e| format!(" (first: {e})"))
    );
    let answers: Vec<String> = growth(&before.front, &after.front, "cdnmap_dns_responses_total")
        .iter()
        .filter(|(_, n)| *n > 0.0)
        .map(|(labels, n)| format!("{labels} {}", count(*n as u64)))
        .collect();
    println!(
        "the front end's own count over the soak (/metrics): cdnmap_dns_responses_total {}; \
         cdnmap_dns_send_errors_total +{:.0}",
        if answers.is_empty() {
            "+0".to_string()
        } else {
            answers.join(", ")
        },
        front("cdnmap_dns_send_errors_total")
    );
}

/// Whether resident memory stayed flat: its `end` against its value after the first minute.
fn verdict(first: f64, end: f64) -> String {
    let growth = end - first;
    let pct = 100.0 * growth / first;
    let within = (FLAT_SHARE * first).max(FLAT_MB);
    if !(first.is_finite() && end.is_finite()) {
        "not measured".into()
    } else if growth <= within {
        format!("flat ({growth:+.1} MB, {pct:+.1}% since the first minute; within {within:.1} MB)")
    } else {
        format!(
            "GROWING ({growth:+.1} MB, {pct:+.1}% since the first minute; more than \
             {within:.1} MB)"
        )
    }
}

pub(super) fn print_memory(s: &Soaked, (store_start, store_end): (u64, u64)) {
    let names = ["cdnmap serve", "cdnmap dns"];
    for (i, name) in names.iter().enumerate() {
        let first = s.rows.first().map_or(f64::NAN, |r| r.rss[i]);
        let end = s.rows.last().map_or(f64::NAN, |r| r.rss[i]);
        let points: Vec<(f64, f64)> = s
            .rows
            .iter()
            .map(|r| (r.end_secs / 60.0, r.rss[i]))
            .collect();
        println!(
            "memory of {name} (VmRSS, sampled every second): start {:.1} MB, after the first \
             minute {first:.1} MB, end {end:.1} MB, max {:.1} MB (peak VmHWM {}); slope {} \
             (least squares over the table's {} rows; — with fewer than 3 or no change): {}",
            s.rss_start[i],
            s.rss_max[i],
            fmt_mb(s.hwm[i]),
            crate::stats::fit_line(&points).map_or("—".to_string(), |(_, mb_per_min, _)| {
                format!("{mb_per_min:+.2} MB/min")
            }),
            s.rows.len(),
            verdict(first, end)
        );
    }
    println!(
        "store on disk: {:.1} MB at the soak's start, {:.1} MB at its end (the demand record \
         bounded by record_max_mb)",
        store_start as f64 / 1e6,
        store_end as f64 / 1e6
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_and_verdicts() {
        assert_eq!(count(0), "0");
        assert_eq!(count(999), "999");
        assert_eq!(count(1_000), "1,000");
        assert_eq!(count(25_012_345), "25,012,345");
        assert!(verdict(100.0, 104.0).starts_with("flat"));
        assert!(verdict(200.0, 209.0).starts_with("flat")); // 5% of 200
        assert!(verdict(200.0, 211.0).starts_with("GROWING"));
        assert!(verdict(20.0, 24.0).starts_with("flat")); // within 5 MB
        assert!(verdict(f64::NAN, 24.0).starts_with("not measured"));
    }
}
