//! The reader and writer against each other and against malformed files.

use super::*;

fn sample() -> GgufWriter {
    let mut w = GgufWriter::new();
    w.add_kv("general.architecture", GgufValue::String("llama".into()))
        .add_kv("llama.block_count", GgufValue::U32(2))
        .add_kv(
            "llama.attention.layer_norm_rms_epsilon",
            GgufValue::F32(1e-5),
        )
        .add_kv("flag", GgufValue::Bool(true))
        .add_kv("big", GgufValue::I64(-7))
        .add_kv(
            "list",
            GgufValue::Array(
                GgufValueType::String,
                vec![
                    GgufValue::String("a".into()),
                    GgufValue::String("bc".into()),
                ],
            ),
        )
        .add_tensor_f32("t0", &[3], vec![1.0, -2.0, 3.5])
        .add_tensor_f32("t1", &[2, 3], (0..6).map(|i| i as f32 * 0.25).collect());
    w
}

#[test]
fn round_trip_keys_and_tensors() {
    let bytes = sample().to_bytes();
    let f = GgufFile::from_bytes(bytes).unwrap();
    assert_eq!(f.version, 3);
    assert_eq!(f.alignment, 32);
    assert_eq!(f.data_offset % 32, 0);
    assert_eq!(f.get_str("general.architecture").unwrap(), "llama");
    assert_eq!(f.get_u32("llama.block_count").unwrap(), 2);
    assert_eq!(
        f.get_f32("llama.attention.layer_norm_rms_epsilon").unwrap(),
        1e-5
    );
    assert_eq!(f.get("flag"), Some(&GgufValue::Bool(true)));
    assert_eq!(f.get("big"), Some(&GgufValue::I64(-7)));
    assert!(
        matches!(f.get("list"), Some(GgufValue::Array(GgufValueType::String, v)) if v.len() == 2)
    );
    assert_eq!(f.tensor_f32("t0").unwrap(), vec![1.0, -2.0, 3.5]);
    let t1 = f.tensor_info("t1").unwrap();
    assert_eq!(t1.dims, vec![2, 3]);
    assert_eq!(t1.offset % 32, 0);
    assert_eq!(f.tensor_f32("t1").unwrap()[5], 1.25);
    // Strict key types, as llama.cpp checks them.
    assert!(matches!(
        f.get_u32("llama.attention.layer_norm_rms_epsilon"),
        Err(GgufError::WrongKeyType { .. })
    ));
    assert!(matches!(
        f.get_u32("nope"),
        Err(GgufError::MissingKey { .. })
    ));
}

#[test]
fn round_trip_through_a_file() {
    let dir = std::env::temp_dir().join(format!("kvaudit-gguf-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("sample.gguf");
    std::fs::write(&path, sample().to_bytes()).unwrap();
    let f = GgufFile::open(&path).unwrap();
    assert_eq!(f.tensor_f32("t1").unwrap().len(), 6);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn truncation_reports_an_offset_not_a_panic() {
    let bytes = sample().to_bytes();
    // Every prefix of the header must fail cleanly.
    let f = GgufFile::from_bytes(bytes.clone()).unwrap();
    for cut in 0..f.data_offset as usize {
        let err = GgufFile::from_bytes(bytes[..cut].to_vec()).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("byte"), "cut at {cut}: {msg}");
    }
    // A cut inside the data section is caught at open time for f32 tensors.
    let err = GgufFile::from_bytes(bytes[..bytes.len() - 40].to_vec()).unwrap_err();
    assert!(matches!(err, GgufError::TensorOutOfBounds { .. }), "{err}");
}

#[test]
fn malformed_fields_are_errors() {
    let mut bytes = sample().to_bytes();
    bytes[0] = b'X';
    assert!(matches!(
        GgufFile::from_bytes(bytes).unwrap_err(),
        GgufError::BadMagic { .. }
    ));
    let mut bytes = sample().to_bytes();
    bytes[4] = 2;
    assert!(matches!(
        GgufFile::from_bytes(bytes).unwrap_err(),
        GgufError::UnsupportedVersion { version: 2 }
    ));
    // A huge tensor count.
    let mut bytes = sample().to_bytes();
    bytes[8..16].copy_from_slice(&i64::MAX.to_le_bytes());
    let err = GgufFile::from_bytes(bytes).unwrap_err();
    assert!(
        matches!(err, GgufError::Malformed { offset: 8, .. }),
        "{err}"
    );
    // An unknown value type on the first key: key string starts at 24 (8 + 21 bytes).
    let mut bytes = sample().to_bytes();
    let ty_at = 24 + 8 + "general.architecture".len();
    bytes[ty_at..ty_at + 4].copy_from_slice(&99u32.to_le_bytes());
    let err = GgufFile::from_bytes(bytes).unwrap_err();
    assert!(
        matches!(err, GgufError::Malformed { offset, .. } if offset == ty_at as u64),
        "{err}"
    );
}

#[test]
fn unsupported_tensor_type_is_an_error() {
    let mut bytes = sample().to_bytes();
    let f = GgufFile::from_bytes(bytes.clone()).unwrap();
    let info = f.tensor_info("t0").unwrap();
    // name (8 + 2) + n_dims (4) + one dim (8) -> type field.
    let ty_at = info.info_offset as usize + 8 + 2 + 4 + 8;
    bytes[ty_at..ty_at + 4].copy_from_slice(&8u32.to_le_bytes()); // q8_0
    let f = GgufFile::from_bytes(bytes).unwrap();
    let err = f.tensor_f32("t0").unwrap_err();
    assert!(
        matches!(err, GgufError::UnsupportedTensorType { .. }),
        "{err}"
    );
    assert!(err.to_string().contains("q8_0"), "{err}");
}

#[test]
fn f16_conversion() {
    assert_eq!(f16_to_f32(0x3c00), 1.0);
    assert_eq!(f16_to_f32(0xc000), -2.0);
    assert_eq!(f16_to_f32(0x7bff), 65504.0);
    assert_eq!(f16_to_f32(0x0001), 2f32.powi(-24));
    assert_eq!(f16_to_f32(0x0400), 2f32.powi(-14));
    assert!(f16_to_f32(0x7e00).is_nan());
    assert_eq!(f16_to_f32(0xfc00), f32::NEG_INFINITY);
    assert_eq!(f16_to_f32(0x8000).to_bits(), (-0.0f32).to_bits());
}
