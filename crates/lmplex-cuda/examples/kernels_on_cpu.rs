//! Runs every CUDA kernel instance on the CPU against its reference and prints one line per
//! instance (name, cases, max error, tolerance, pass/fail), then `N passed, M failed`; exits 1
//! when any failed. An optional argument keeps the instances whose name contains it.

fn main() {
    let filter = std::env::args().nth(1).unwrap_or_default();
    let reports = lmplex_cuda::kernel_check::run_all(&filter);
    let failed = reports.iter().filter(|r| !r.passed()).count();
    for r in &reports {
        let verdict = if r.passed() { "pass" } else { "FAIL" };
        println!(
            "{:<30} {:>2} cases  max error {:.2e}  (tolerance {:.1e})  {verdict}",
            r.kernel, r.cases, r.max_err, r.tol
        );
        for f in &r.failures {
            println!("    {f}");
        }
    }
    println!("{} passed, {failed} failed", reports.len() - failed);
    if failed > 0 || reports.is_empty() {
        std::process::exit(1);
    }
}
