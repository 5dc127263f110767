//! Prints the device-free figures of the GPU path (`lmplex_cuda::profile::report`) as JSON: per
//! shape, decode at batch 1, 64 and 256 and a 1,000-token prefill, each with its launches, bytes
//! against the step's minimum and modeled H100 time. `lmplex bench --workloads gpu-model` runs
//! the same through the Python package.

fn main() {
    match lmplex_cuda::profile::report() {
        Ok(report) => println!("{report:#}"),
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(1);
        }
    }
}
