//! The wire's tests: requests and reply frames round-trip, every cut or garbled line and frame is a
//! typed error, and the fuzz seeds are what this code writes.

use super::*;
use crate::oracles::OracleId;

/// The seeds of the `worker_wire` fuzz target (`fuzz/seeds/worker_wire/`) are real lines and
/// frames of this wire: a request for seed-domain traces, a run reply, a death and an error.
/// `KVAUDIT_BLESS_SEEDS=1` writes them; otherwise they must be what this code writes.
#[test]
fn the_fuzz_seeds_are_real_lines() {
    let d = crate::base::domain::Domain::preset("seed").unwrap();
    let ops = d.ops();
    let traces: Vec<Trace> = (0..6)
        .map(|i| Trace {
            setup: d.setup.clone(),
            ops: vec![ops[i * 7].clone(), ops[(i * 11) % ops.len()].clone()],
        })
        .collect();
    let seq = SeqObservation {
        seq: 0,
        pos_min: 0,
        pos_max: 6,
        cells: vec![0, 1, 2, 3, 4, 5, 6],
        second_cells: None,
        third_cells: None,
    };
    let run = TrialRun {
        steps: vec![Arc::new(StepObservation::basic(
            OpOutcome::Done {
                returned: Some(true),
            },
            vec![seq],
        ))],
        end: TrialEnd::Crashed {
            step: 2,
            message: "signal SIGABRT".into(),
        },
        observation_crash: None,
        code: None,
        judged: None,
    };
    let frame = |r: &Reply| {
        let mut v = Vec::new();
        encode_reply(r, &mut v).unwrap();
        v
    };
    let seeds = [
        ("gen-request", Request::new(&traces, true, false).to_line()),
        ("gen-reply-run", frame(&Reply::Run(run))),
        ("gen-reply-died", frame(&Reply::Died(134))),
        (
            "gen-reply-judged",
            frame(&Reply::Judged(
                StepVerdicts {
                    judged: 0b101,
                    violated: 0b100,
                },
                3,
            )),
        ),
        (
            "gen-request-judging",
            Request::new(&traces, true, false)
                .judging(&BatchJudging {
                    oracles: vec![OracleId::I1, OracleId::I2],
                    prior: (0..traces.len() as u64).map(|i| i % 4).collect(),
                })
                .to_line(),
        ),
        (
            "gen-reply-error",
            frame(&Reply::Error("bad request".into())),
        ),
        (
            "gen-request-enumerated",
            Request::enumerated(
                &d.setup,
                Enumerated {
                    ops: &ops,
                    depth: 2,
                    from: 60,
                },
                6,
                true,
            )
            .unwrap()
            .to_line(),
        ),
    ];
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds/worker_wire");
    for (name, bytes) in seeds {
        let path = dir.join(name);
        if std::env::var_os("KVAUDIT_BLESS_SEEDS").is_some() {
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(&path, &bytes).unwrap();
        }
        let on_disk = std::fs::read(&path).unwrap_or_default();
        assert_eq!(
            on_disk,
            bytes,
            "{} is stale: KVAUDIT_BLESS_SEEDS=1 rewrites it",
            path.display()
        );
    }
}

#[test]
fn requests_carry_each_setup_and_op_once_and_give_the_traces_back() {
    let d = crate::base::domain::Domain::preset("seed").unwrap();
    let ops = d.ops();
    let other_setup = Setup {
        n_seq_max: 3,
        ..d.setup.clone()
    };
    let traces: Vec<Trace> = (0..40)
        .map(|i| Trace {
            setup: if i % 7 == 0 {
                other_setup.clone()
            } else {
                d.setup.clone()
            },
            ops: vec![ops[i % 5].clone(), ops[(i * 3) % 11].clone()],
        })
        .collect();
    let req = Request::new(&traces, true, false);
    assert_eq!(req.setups.len(), 2);
    assert!(req.ops.len() <= 11, "{} ops", req.ops.len());
    let back = parse_request_line(&req.to_line()).unwrap();
    let mut into = Trace {
        setup: Setup::default(),
        ops: vec![],
    };
    // In order (as the worker fills them), in reverse, and each from an empty trace: the ops
    // kept in place from the trace before are the right ones.
    for (i, t) in traces.iter().enumerate() {
        back.fill(i, &mut into, &mut FillScratch::default());
        assert_eq!(&into, t, "trace {i}");
    }
    for (i, t) in traces.iter().enumerate().rev() {
        back.fill(i, &mut into, &mut FillScratch::default());
        assert_eq!(&into, t, "trace {i}, back to front");
    }
    for (i, t) in traces.iter().enumerate() {
        let mut fresh = Trace {
            setup: Setup::default(),
            ops: vec![],
        };
        back.fill(i, &mut fresh, &mut FillScratch::default());
        assert_eq!(&fresh, t, "trace {i}, from nothing");
    }
    let mut bad = back;
    bad.traces[0].1.push(999);
    let err = parse_request_line(&bad.to_line()).unwrap_err();
    assert!(matches!(err, WireError::Invalid(_)), "{err:?}");
    assert!(err.to_string().contains("no op 999"), "{err}");
}

/// An enumerated request (an explorer's batch as its place in the enumeration) makes the
/// traces the explorer enumerates, in order, across the first ops' chunks, filled into one
/// trace as the worker fills them and each from nothing; a run that leaves the enumeration, or
/// names a depth, op or setup the request lacks, is invalid.
#[test]
fn an_enumerated_request_makes_the_enumerated_traces() {
    let d = crate::base::domain::Domain::preset("seed").unwrap();
    let ops = d.ops();
    let n = ops.len();
    for (depth, from, len) in [(1, 0, n), (2, 3, 2 * n + 5), (3, n as u64 * 7 - 2, 3 * n)] {
        let expected: Vec<Trace> = (from..from + len as u64)
            .map(|number| {
                let mut digits = Vec::new();
                let mut rest = number;
                for _ in 0..depth {
                    digits.push((rest % n as u64) as usize);
                    rest /= n as u64;
                }
                Trace {
                    setup: d.setup.clone(),
                    ops: digits.iter().rev().map(|&k| ops[k].clone()).collect(),
                }
            })
            .collect();
        let run = Enumerated {
            ops: &ops,
            depth,
            from,
        };
        let req = Request::enumerated(&d.setup, run, len, true).unwrap();
        let back = parse_request_line(&req.to_line()).unwrap();
        assert_eq!(back.len(), len);
        assert_eq!(back.first_setup(), Some(&d.setup));
        let mut into = Trace {
            setup: Setup::default(),
            ops: vec![],
        };
        let mut scratch = FillScratch::default();
        for (i, t) in expected.iter().enumerate() {
            back.fill(i, &mut into, &mut scratch);
            assert_eq!(&into, t, "depth {depth}, trace {i}");
            let mut fresh = Trace {
                setup: Setup::default(),
                ops: vec![],
            };
            back.fill(i, &mut fresh, &mut FillScratch::default());
            assert_eq!(&fresh, t, "depth {depth}, trace {i} from nothing");
        }
    }
    // Too many traces, or none: sent trace by trace instead.
    let run = Enumerated {
        ops: &ops,
        depth: 2,
        from: 0,
    };
    assert!(Request::enumerated(&d.setup, run, MAX_ENUMERATED_TRACES + 1, true).is_none());
    assert!(Request::enumerated(&d.setup, run, 0, true).is_none());
    // Invalid runs, as a worker reads them.
    let invalid = |edit: &dyn Fn(&mut Odometer), why: &str| {
        let mut req = Request::enumerated(&d.setup, run, 10, true).unwrap();
        edit(req.odometer.as_mut().unwrap());
        let err = parse_request_line(&req.to_line()).unwrap_err();
        assert!(matches!(err, WireError::Invalid(_)), "{why}: {err:?}");
        assert!(err.to_string().contains(why), "{why}: {err}");
    };
    invalid(
        &|o| o.from = (n * n - 5) as u64,
        "of an enumeration that holds",
    );
    invalid(&|o| o.depth = 0, "depth 0");
    invalid(&|o| o.depth = MAX_ENUMERATED_DEPTH + 1, "depth 65");
    invalid(&|o| o.setup = 1, "no setup 1");
    invalid(&|o| o.from = u64::MAX - 3, "of an enumeration that holds");
    let mut listed = Request::enumerated(&d.setup, run, 10, true).unwrap();
    listed.traces.push((0, vec![0]));
    let err = parse_request_line(&listed.to_line()).unwrap_err();
    assert!(err.to_string().contains("lists no traces"), "{err}");
}

#[test]
fn runs_survive_the_wire_form() {
    let seqs = vec![
        SeqObservation {
            seq: 0,
            pos_min: 0,
            pos_max: 6,
            cells: vec![0, 1, 2, 2, 6],
            second_cells: None,
            third_cells: None,
        },
        SeqObservation {
            seq: 1,
            pos_min: -1,
            pos_max: -1,
            cells: vec![],
            second_cells: None,
            third_cells: None,
        },
    ];
    let step = |outcome| Arc::new(StepObservation::basic(outcome, seqs.clone()));
    let runs = [
        TrialRun {
            steps: vec![
                step(OpOutcome::Done { returned: None }),
                step(OpOutcome::Done {
                    returned: Some(false),
                }),
                step(OpOutcome::Decoded { rc: -1 }),
                step(OpOutcome::Refused {
                    reason: "seq 9".into(),
                }),
            ],
            end: TrialEnd::Completed,
            observation_crash: None,
            code: None,
            judged: None,
        },
        TrialRun {
            steps: vec![step(OpOutcome::Unsupported {
                reason: "why".into(),
            })],
            end: TrialEnd::Unsupported {
                step: 1,
                reason: "why".into(),
            },
            observation_crash: None,
            code: None,
            judged: None,
        },
        TrialRun {
            steps: vec![],
            end: TrialEnd::Crashed {
                step: 2,
                message: "SIGABRT".into(),
            },
            observation_crash: None,
            code: None,
            judged: None,
        },
    ];
    let mut rich = runs[0].clone();
    let mut step = StepObservation::clone(&rich.steps[0]);
    step.whole = Some(vec![
        WholeCell {
            pos: 3,
            seqs: vec![0, 1],
        },
        WholeCell {
            pos: 4,
            seqs: vec![],
        },
    ]);
    step.round_trip = Some(RoundTrip {
        whole_loaded: true,
        whole_twin: seqs.clone(),
        whole_same_bytes: false,
        seqs: vec![SeqRoundTrip {
            loaded: false,
            twin: seqs[0].clone(),
            same_bytes: true,
        }],
    });
    step.before = Some(seqs.clone());
    // Every bit of each logit survives (the cross-logits oracle compares them across engines).
    step.next_logits = Some(vec![
        NextLogits {
            seq: 0,
            logits: vec![1.5, -0.0, f32::MIN_POSITIVE, f32::MAX, f32::INFINITY],
        },
        NextLogits {
            seq: 3,
            logits: vec![],
        },
    ]);
    step.seqs[0].second_cells = Some(vec![6]);
    rich.steps[0] = Arc::new(step);
    rich.code = Some(Box::new(CodeCoverage {
        pcs: vec![1, 70000],
        edges: vec![u32::MAX],
        outside: vec![3, 2],
    }));
    rich.observation_crash = Some(Box::new(crate::running::runner::ObservationCrash {
        step: 1,
        observation: Observation::Whole,
        message: "SIGSEGV".into(),
    }));
    let mut frame = Vec::new();
    for run in runs.into_iter().chain([rich]) {
        encode_reply(&Reply::Run(run.clone()), &mut frame).unwrap();
        match parse_reply_frame(&frame).unwrap() {
            Reply::Run(back) => assert_eq!(back, run),
            other => panic!("{other:?}"),
        }
    }
    // A trial judged in the worker: its verdict bits, all 64 of each.
    // A run of trials judged alike: their verdict bits, all 64 of each, and how many.
    for (judged, violated, count) in [(0, 0, 1), (1, 0, 256), (u64::MAX, 1 << 63, u32::MAX)] {
        let v = StepVerdicts { judged, violated };
        encode_reply(&Reply::Judged(v, count), &mut frame).unwrap();
        assert!(
            matches!(parse_reply_frame(&frame), Ok(Reply::Judged(back, n)) if back == v && n == count)
        );
    }
    // A judged reply for no trial is not a reply.
    encode_reply(&Reply::Judged(StepVerdicts::default(), 0), &mut frame).unwrap();
    assert!(parse_reply_frame(&frame).is_err());
}

/// A request names the oracles the worker judges with and each trace's prior bits; an oracle
/// the worker does not have (not built in), or prior bits for another number of traces, make
/// the request invalid, not trials judged otherwise.
#[test]
fn a_request_judges_with_built_in_oracles_only() {
    let traces = vec![
        Trace {
            setup: Setup::default(),
            ops: vec![Op::Clear],
        };
        2
    ];
    let judging = BatchJudging {
        oracles: vec![OracleId::I1, OracleId::I2],
        prior: vec![0, 2],
    };
    let line = Request::new(&traces, true, false)
        .judging(&judging)
        .to_line();
    let req = parse_request_line(&line).unwrap();
    let names: Vec<_> = req.judges().unwrap().iter().map(|o| o.id()).collect();
    assert_eq!(names, [OracleId::I1, OracleId::I2]);
    assert_eq!((req.prior(0), req.prior(1)), (0, 2));
    let text = String::from_utf8(line).unwrap();
    let unknown = text.replace("\"I2\"", "\"no-such-oracle\"");
    assert!(matches!(
        parse_request_line(unknown.as_bytes()),
        Err(WireError::Invalid(why)) if why.contains("no-such-oracle")
    ));
    let short = text.replace("\"prior\":[0,2]", "\"prior\":[0]");
    assert!(matches!(
        parse_request_line(short.as_bytes()),
        Err(WireError::Invalid(why)) if why.contains("prior bits for 1 traces")
    ));
}

/// A step whose bytes the reader's cache has seen comes back as the same shared observation
/// (so that its verdicts are memoized), equal to what a fresh decode gives; another step does
/// not, and a full cache starts afresh.
#[test]
fn a_step_seen_before_is_shared() {
    let step = |cells: Vec<i32>| {
        Arc::new(StepObservation::basic(
            OpOutcome::Done { returned: None },
            vec![SeqObservation {
                seq: 0,
                pos_min: cells.first().copied().unwrap_or(-1),
                pos_max: cells.last().copied().unwrap_or(-1),
                cells,
                second_cells: None,
                third_cells: None,
            }],
        ))
    };
    let frame_of = |st: Arc<StepObservation>| {
        let mut frame = Vec::new();
        encode_reply(
            &Reply::Run(TrialRun::new(vec![st], TrialEnd::Completed)),
            &mut frame,
        )
        .unwrap();
        frame
    };
    let steps_of = |reply: Reply| match reply {
        Reply::Run(run) => run.steps,
        other => panic!("{other:?}"),
    };
    let mut cache = StepCache::default();
    let a = frame_of(step(vec![0, 1, 2]));
    let b = frame_of(step(vec![0, 2]));
    let first = steps_of(parse_reply_frame_shared(&a, &mut cache).unwrap());
    let again = steps_of(parse_reply_frame_shared(&a, &mut cache).unwrap());
    let other = steps_of(parse_reply_frame_shared(&b, &mut cache).unwrap());
    assert!(Arc::ptr_eq(&first[0], &again[0]));
    assert!(!Arc::ptr_eq(&first[0], &other[0]));
    assert_eq!(first, steps_of(parse_reply_frame(&a).unwrap()));
    assert_eq!(other, steps_of(parse_reply_frame(&b).unwrap()));
    // Filled up, the cache forgets and decodes afresh.
    for k in 0..StepCache::MAX_STEPS as i32 {
        parse_reply_frame_shared(&frame_of(step(vec![k + 10])), &mut cache).unwrap();
    }
    let after = steps_of(parse_reply_frame_shared(&a, &mut cache).unwrap());
    assert!(!Arc::ptr_eq(&first[0], &after[0]));
    assert_eq!(first, after);
}

/// A valid request line and reply frame, as the other side writes them.
fn valid_lines() -> (Vec<u8>, Vec<u8>) {
    let d = crate::base::domain::Domain::preset("seed").unwrap();
    let trace = Trace {
        setup: d.setup.clone(),
        ops: d.ops()[..3].to_vec(),
    };
    let request = Request::new(&[trace], false, false).to_line();
    let mut reply = Vec::new();
    encode_reply(&Reply::Error("no model".into()), &mut reply).unwrap();
    (request, reply)
}

#[test]
fn a_reply_reaches_the_pipe_whole_or_not_at_all() {
    // What a child leaves in the pipe when it crashes right after a reply it did not
    // flush: whole frames only, however small the buffer against the frame.
    let mut out = std::io::BufWriter::with_capacity(16, Vec::new());
    let mut replies = ReplyWriter::default();
    for n in [3, 40, 200] {
        let reply = Reply::Error("x".repeat(n));
        assert!(replies.write(&mut out, &reply, false));
        let mut in_pipe = &out.get_ref()[..];
        let mut frame = Vec::new();
        loop {
            match read_frame_limited(&mut in_pipe, &mut frame, 1 << 20).unwrap() {
                FrameRead::Frame => assert!(parse_reply_frame(&frame).is_ok()),
                FrameRead::End => break,
                other => panic!("{other:?} in the pipe after {n}: {:?}", out.get_ref()),
            }
        }
    }
}

#[test]
fn truncated_garbage_and_huge_lines_are_errors_not_panics() {
    let (request, reply) = valid_lines();
    assert!(parse_request_line(&request).is_ok());
    assert!(matches!(parse_reply_frame(&reply), Ok(Reply::Error(e)) if e == "no model"));
    // Every truncation of a valid line is refused (a prefix of JSON is never JSON here).
    for cut in 0..request.len() - 1 {
        let err = parse_request_line(&request[..cut]).unwrap_err();
        assert!(matches!(err, WireError::Malformed { .. }), "{cut}: {err}");
    }
    for cut in 0..reply.len() {
        assert!(parse_reply_frame(&reply[..cut]).is_err(), "{cut}");
    }
    // Another version is refused with both versions named.
    let mut other = reply.clone();
    other[4] ^= 0x40;
    let err = parse_reply_frame(&other).unwrap_err();
    assert!(
        matches!(
            err,
            WireError::Version { expected, .. }
                if expected as u64 == u64::from(super::REPLY_WIRE_VERSION)
        ),
        "{err}"
    );
    assert!(
        err.to_string().contains("another build of kvaudit"),
        "{err}"
    );
    let garbage: [&[u8]; 8] = [
        b"",
        b"\n",
        b"\xff\xfe\x00garbage",
        b"null",
        b"{\"died\":\"x\"}",
        b"{\"setups\":[],\"ops\":[],\"traces\":[[0,[]]]}",
        b"{\"run\":[[[{\"D\":null},[[0,0,0,[1,2]]]]],\"C\"],\"extra\":1}",
        &[b'['; 10_000],
    ];
    for g in garbage {
        let excerpt = String::from_utf8_lossy(&g[..g.len().min(20)]).into_owned();
        assert!(parse_request_line(g).is_err(), "request {excerpt:?}");
        assert!(parse_reply_frame(g).is_err(), "reply {excerpt:?}");
    }
    // An index past the end is the one well-formed request that is still refused.
    let err = parse_request_line(garbage[5]).unwrap_err();
    assert!(err.to_string().contains("no setup 0"), "{err}");
    // Over the limit: refused before decoding, and the message states the limit.
    let mut huge = ((MAX_REPLY_FRAME_BYTES + 1) as u32).to_le_bytes().to_vec();
    huge.extend_from_slice(&REPLY_WIRE_VERSION.to_le_bytes());
    let err = parse_reply_frame(&huge).unwrap_err();
    assert!(matches!(err, WireError::TooLong { .. }), "{err}");
    assert!(err.to_string().contains(&MAX_REPLY_FRAME_BYTES.to_string()));
    let huge = vec![b' '; MAX_REQUEST_LINE_BYTES + 1];
    assert!(matches!(
        parse_request_line(&huge),
        Err(WireError::TooLong { .. })
    ));
    // A malformed line is quoted, but only its start.
    let mut long = vec![b'x'; 5000];
    long[..4].copy_from_slice(&4996u32.to_le_bytes());
    let err = parse_reply_frame(&long).unwrap_err().to_string();
    assert!(err.len() < 400, "{}", err.len());
}

#[test]
fn frame_reads_skip_oversized_frames_and_stop_at_a_truncated_one() {
    let frame = |r: &Reply| {
        let mut v = Vec::new();
        encode_reply(r, &mut v).unwrap();
        v
    };
    let mut input = frame(&Reply::Died(9));
    input.extend(frame(&Reply::Error("e".repeat(100))));
    input.extend(frame(&Reply::Retired));
    let whole = input.len();
    input.extend(&frame(&Reply::Died(6))[..5]);
    assert!(whole_frame_buffered(&input));
    assert!(!whole_frame_buffered(&input[whole..]));
    let mut reader = io::BufReader::with_capacity(7, &input[..]);
    let mut buf = Vec::new();
    let mut next = |reader: &mut io::BufReader<&[u8]>| {
        let r = read_frame_limited(reader, &mut buf, 64).unwrap();
        (r, parse_reply_frame(&buf).map(|r| r.kind()).ok())
    };
    assert_eq!(next(&mut reader), (FrameRead::Frame, Some("died")));
    // Over the limit of 64 bytes: skipped whole, the next frame read as it is.
    assert_eq!(next(&mut reader).0, FrameRead::TooLong);
    assert_eq!(next(&mut reader), (FrameRead::Frame, Some("retired")));
    // The writer died mid-frame: the rest is dropped, not decoded.
    assert_eq!(next(&mut reader), (FrameRead::Truncated, None));
    assert_eq!(next(&mut reader).0, FrameRead::End);
    // A header announcing more than the limit allocates nothing for it.
    let mut lying = u32::MAX.to_le_bytes().to_vec();
    lying.extend_from_slice(&[0; 10]);
    let mut buf = Vec::new();
    let r = read_frame_limited(&mut &lying[..], &mut buf, MAX_REPLY_FRAME_BYTES).unwrap();
    assert_eq!(r, FrameRead::Truncated);
    assert!(buf.capacity() < 1024, "{}", buf.capacity());
}

#[test]
fn bounded_reads_stop_at_the_limit_and_resume_at_the_next_line() {
    let input = b"short\nthis one is far too long\nok\nlast without newline";
    // A tiny buffer, so that lines span several reads.
    let mut reader = io::BufReader::with_capacity(4, &input[..]);
    let mut line = Vec::new();
    let mut next = |reader: &mut io::BufReader<&[u8]>| {
        let r = read_line_limited(reader, &mut line, 10).unwrap();
        (r, String::from_utf8(line.clone()).unwrap())
    };
    assert_eq!(next(&mut reader), (LineRead::Line, "short".into()));
    assert_eq!(next(&mut reader), (LineRead::TooLong, "".into()));
    assert_eq!(next(&mut reader), (LineRead::Line, "ok".into()));
    assert_eq!(next(&mut reader).0, LineRead::TooLong);
    assert_eq!(next(&mut reader), (LineRead::End, "".into()));
    let mut exact = &b"0123456789\n"[..];
    assert_eq!(
        read_line_limited(&mut exact, &mut line, 10).unwrap(),
        LineRead::Line
    );
}

#[test]
fn an_oversized_request_on_the_pipe_is_a_typed_error() {
    use std::io::Read as _;
    let endless = io::repeat(b'[').take(MAX_REQUEST_LINE_BYTES as u64 + 10);
    let mut input = io::BufReader::with_capacity(1 << 20, endless);
    let mut line = Vec::new();
    let err = read_request(&mut input, &mut line).unwrap_err();
    assert!(
        matches!(
            err,
            WireError::TooLong {
                what: "request",
                ..
            }
        ),
        "{err}"
    );
}
