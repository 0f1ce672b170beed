use std::time::Duration;
use squarepeg_experiments::voip::{VoipConfig, config, report, sim};
fn main() {
    let secs: u64 = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(20);
    let seed: u64 = std::env::args().nth(2).and_then(|a| a.parse().ok()).unwrap_or(1);
    let c = VoipConfig { drain: Duration::from_secs(3), ..VoipConfig::for_duration(Duration::from_secs(secs)).unwrap() };
    let mut runs = Vec::new();
    for sc in [config::hollywood_70ms(), config::hollywood_15ms()] {
        for t in sim::transports() {
            let r = sim::run(&sc, t.as_ref(), &c, seed).unwrap();
            let s = &r.analysis.summary;
            eprintln!("{} {} dropped {} replaced {} warnings {:?}", sc.name, r.transport, s.dropped_by_sender, s.replaced_by_sender, r.warnings.iter().take(3).collect::<Vec<_>>());
            runs.push(r);
        }
    }
    print!("{}", report::table(&runs));
}
