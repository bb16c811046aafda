//! The random and the guided generator measured on the same target and budget, as `cargo bench
//! --bench fuzz` prints them (docs/performance.md, "Fuzz generators").
//!
//! Per run: the coverage (the edges of the target's memory code where it records them, a `+cov`
//! build; the abstract transitions and shapes elsewhere: the signal the guided generator steers
//! by), the case and wall time of the first finding of any kind, and of the first finding of a
//! named class (a corpus file's oracle, kind and op at the failing step). The first finding of
//! any kind is found within a few cases by both generators (the seed's I1 bug on 0.1.156 and on
//! the native `refcount` fault: a fresh trace of 32-64 ops holds the pattern about one time in
//! four), so it measures the first cases' luck; the named class is a finding the easy ones do
//! not give (on the same bug, `seq_rm` of part of a doubly copied range: the random generator's
//! case 155 on seed 1), where guidance can show. Over seeds: the mean and the median, a run that
//! did not find it counted at its budget (so the figure is a lower bound; the count found says
//! how many are).

use crate::oracles::OracleId;
use crate::records::report::Report;

/// A class of finding: what the corpus file of one finding says (its oracle, its kind, and the
/// op at its failing step).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FindingClass {
    /// The oracle.
    pub oracle: OracleId,
    /// The violation's kind.
    pub kind: String,
    /// The name of the op at the failing step.
    pub op: String,
}

/// When a run first found something: its case (counted from 0) and the seconds since the run
/// began.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FirstFound {
    /// The case.
    pub case: u64,
    /// Wall time at the end of that case's judgement.
    pub seconds: f64,
}

/// What one fuzz run gave.
#[derive(Clone, Debug, PartialEq)]
pub struct RunFigures {
    /// Cases run.
    pub cases: u64,
    /// Wall time of the run.
    pub seconds: f64,
    /// Abstract transitions and shapes reached.
    pub transitions: u64,
    /// Observation shapes reached.
    pub shapes: u64,
    /// PCs and edges of the target's memory code (0 where the target does not record them).
    pub pcs: u64,
    /// Edges of the target's memory code.
    pub edges: u64,
    /// The first finding of any kind.
    pub first: Option<FirstFound>,
    /// The first finding of the class.
    pub first_of_class: Option<FirstFound>,
    /// Distinct findings (one per oracle, kind and shape of the minimal trace).
    pub findings: usize,
}

impl RunFigures {
    /// The figures of `report` (a fuzz run's) that took `seconds`, with `class` as the named
    /// class.
    pub fn of(report: &Report, seconds: f64, class: &FindingClass) -> RunFigures {
        let fz = report.fuzz.as_ref().expect("a fuzz report");
        let last = fz.coverage.last().copied().unwrap_or_default();
        let found = report.findings.iter().zip(&fz.findings);
        let first_where = |pred: &dyn Fn(&crate::records::report::Finding) -> bool| {
            found
                .clone()
                .filter(|(f, _)| pred(f))
                .map(|(_, r)| FirstFound {
                    case: r.case,
                    seconds: r.found_at_s,
                })
                .min_by(|a, b| a.case.cmp(&b.case))
        };
        RunFigures {
            cases: fz.cases,
            seconds,
            transitions: last.transitions,
            shapes: last.shapes,
            pcs: last.pcs,
            edges: last.edges,
            first: first_where(&|_| true),
            first_of_class: first_where(&|f| {
                f.oracle == class.oracle
                    && f.kind == class.kind
                    && f.step > 0
                    && f.trace.ops.get(f.step - 1).map(|o| o.name()) == Some(class.op.as_str())
            }),
            findings: report.findings.len(),
        }
    }

    /// The coverage the guided generator steers by: edges where the target records them, else
    /// transitions and shapes.
    pub fn coverage(&self) -> u64 {
        if self.pcs > 0 {
            self.edges
        } else {
            self.transitions + self.shapes
        }
    }
}

/// The mean and the median of some figures.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Spread {
    /// Mean.
    pub mean: f64,
    /// Median (of an even count, the mean of the middle two).
    pub median: f64,
}

impl Spread {
    /// Of `values` (NaN for none).
    pub fn of(mut values: Vec<f64>) -> Spread {
        values.sort_by(f64::total_cmp);
        let n = values.len();
        let median = match n {
            0 => f64::NAN,
            n if n % 2 == 1 => values[n / 2],
            n => (values[n / 2 - 1] + values[n / 2]) / 2.0,
        };
        let mean = if n == 0 {
            f64::NAN
        } else {
            values.iter().sum::<f64>() / n as f64
        };
        Spread { mean, median }
    }
}

/// A first finding over the runs of one generator: in how many it was found, and its case and
/// seconds, a run that did not find it counted at its budget (its cases and its whole time).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FirstSummary {
    /// Runs that found it.
    pub found: usize,
    /// Runs.
    pub runs: usize,
    /// Its case.
    pub case: Spread,
    /// Its seconds.
    pub seconds: Spread,
}

impl FirstSummary {
    /// Over `runs`, the first finding `first` picks.
    pub fn of(runs: &[RunFigures], first: impl Fn(&RunFigures) -> Option<FirstFound>) -> Self {
        let at = |r: &RunFigures| {
            first(r).unwrap_or(FirstFound {
                case: r.cases,
                seconds: r.seconds,
            })
        };
        FirstSummary {
            found: runs.iter().filter(|r| first(r).is_some()).count(),
            runs: runs.len(),
            case: Spread::of(runs.iter().map(|r| at(r).case as f64).collect()),
            seconds: Spread::of(runs.iter().map(|r| at(r).seconds).collect()),
        }
    }
}

/// One generator's runs, summarised.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GeneratorSummary {
    /// The coverage ([`RunFigures::coverage`]).
    pub coverage: Spread,
    /// Wall time per run.
    pub seconds: Spread,
    /// The first finding of any kind.
    pub first: FirstSummary,
    /// The first finding of the class.
    pub first_of_class: FirstSummary,
}

impl GeneratorSummary {
    /// Of `runs` (one per seed).
    pub fn of(runs: &[RunFigures]) -> Self {
        GeneratorSummary {
            coverage: Spread::of(runs.iter().map(|r| r.coverage() as f64).collect()),
            seconds: Spread::of(runs.iter().map(|r| r.seconds).collect()),
            first: FirstSummary::of(runs, |r| r.first),
            first_of_class: FirstSummary::of(runs, |r| r.first_of_class),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engines::fuzz::{
        case_runner, run_fuzz_with_queue, trace_strategy, Coverage, FuzzConfig, GenConfig,
        Generator,
    };
    use crate::engines::shrink::ShrinkConfig;
    use crate::running::judge::Judge;
    use crate::targets::registry::TargetSpec;
    use proptest::strategy::{Strategy, ValueTree};

    #[test]
    fn spreads_and_first_findings_count_the_unfound_at_the_budget() {
        assert_eq!(
            Spread::of(vec![3.0, 1.0, 2.0]),
            Spread {
                mean: 2.0,
                median: 2.0
            }
        );
        assert_eq!(Spread::of(vec![4.0, 1.0]).median, 2.5);
        let run = |first: Option<u64>| RunFigures {
            cases: 100,
            seconds: 10.0,
            transitions: 5,
            shapes: 2,
            pcs: 0,
            edges: 0,
            first: None,
            first_of_class: first.map(|case| FirstFound {
                case,
                seconds: case as f64 / 10.0,
            }),
            findings: 0,
        };
        let runs = [run(Some(10)), run(None), run(Some(40))];
        let s = FirstSummary::of(&runs, |r| r.first_of_class);
        assert_eq!((s.found, s.runs), (2, 3));
        assert_eq!(s.case, Spread::of(vec![10.0, 100.0, 40.0]));
        assert_eq!(s.seconds, Spread::of(vec![1.0, 10.0, 4.0]));
        assert_eq!(runs[0].coverage(), 7);
        let with_code = RunFigures {
            pcs: 3,
            edges: 9,
            ..run(None)
        };
        assert_eq!(with_code.coverage(), 9);
    }

    /// On the native model with the `refcount` fault, the random generator's figures are the
    /// ones a case-by-case rerun of its traces gives: the coverage, the first I1 case, and the
    /// first case whose first I1 violation is of the class.
    #[test]
    fn the_figures_of_a_random_run_are_what_its_cases_show() {
        let factory = TargetSpec::new("native", &["refcount".into()])
            .factory()
            .unwrap();
        let gen = GenConfig::default();
        let cases = 60;
        let cfg = FuzzConfig {
            seed: 2,
            cases: Some(cases),
            time: None,
            gen: gen.clone(),
            shrink: ShrinkConfig::default(),
            shrinks_per_signature: 1,
            oracles: Some(vec![OracleId::I1]),
            theorems: Vec::new(),
            generator: Generator::Random,
            corpus: Vec::new(),
        };
        let (report, _) =
            run_fuzz_with_queue(&cfg, factory.as_ref(), None, None, &mut |_| {}).unwrap();
        let class = FindingClass {
            oracle: OracleId::I1,
            kind: "pos_max disagree with the cells".into(),
            op: "seq_rm".into(),
        };
        let figures = RunFigures::of(&report, 1.0, &class);

        let mut judge = Judge::new(factory.as_ref(), None).unwrap();
        let mut coverage = Coverage::default();
        let strategy = trace_strategy(&gen);
        let (mut first, mut first_of_class) = (None, None);
        for case in 0..cases {
            let trace = strategy
                .new_tree(&mut case_runner(cfg.seed, case))
                .unwrap()
                .current();
            let (verdict, run) = judge.run_observed(&trace).unwrap();
            coverage.add(&trace, &run);
            if let Some(v) = verdict.first(OracleId::I1) {
                first.get_or_insert(case);
                let op = trace.ops[v.step - 1].name();
                if v.violation.kind == class.kind && op == class.op {
                    first_of_class.get_or_insert(case);
                }
            }
        }
        let point = coverage.point(cases, 0.0);
        assert_eq!(
            (figures.transitions, figures.shapes),
            (point.transitions, point.shapes)
        );
        assert_eq!(figures.first.map(|f| f.case), first);
        assert_eq!(figures.first_of_class.map(|f| f.case), first_of_class);
        assert!(first.is_some() && first_of_class.is_some(), "{figures:?}");
        assert!(figures.findings > 0 && figures.cases == cases);
    }
}
