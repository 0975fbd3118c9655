// Temporary: callgrind target for the incremental scan.
fn main() {
    let body = std::fs::read("/tmp/abl/body_1m.json").unwrap();
    let reps: usize = std::env::args().nth(1).map_or(5, |a| a.parse().unwrap());
    for _ in 0..reps {
        let mut inc = halo_policy::body_scan::Incremental::new();
        let mut end = 0;
        for cut in [262_144, 524_288, 786_432] {
            end = cut;
            inc.feed(&body[..end]).unwrap();
        }
        let _ = end;
        let top = inc.finish(&body).unwrap();
        std::hint::black_box(top);
    }
}
