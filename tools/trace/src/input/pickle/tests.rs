//! The reader on what CPython writes, on shared references, on huge ints, on malformed input and
//! on PyTorch's own snapshot.

use super::*;

fn read_bytes(bytes: &[u8]) -> Result<Pickle, Error> {
    read(bytes)
}

/// The items of the list, tuple or set `id`.
fn items(p: &Pickle, id: Id) -> Vec<&Node> {
    match p.node(id) {
        Node::List(v) | Node::Tuple(v) | Node::Set(v) => v.iter().map(|&i| p.node(i)).collect(),
        other => panic!("not a sequence: {other:?}"),
    }
}

/// `{'a': [1, -5, 2**70, -2**70, True, None, 1.5, b'xy', (1, 2), set or frozenset], 'b': 'é'}`
/// as CPython writes it in protocol 0 and 2 (bytes and sets are objects there).
fn check_python_value(p: &Pickle) {
    let Node::Dict(top) = p.node(p.root) else {
        panic!("not a dict: {:?}", p.node(p.root));
    };
    assert_eq!(p.node(top[0].0), &Node::Str("a".into()));
    let a = items(p, top[0].1);
    assert_eq!(a[0], &Node::Int(1));
    assert_eq!(a[1], &Node::Int(-5));
    assert_eq!(a[2], &Node::Int(1 << 70));
    assert_eq!(a[3], &Node::Int(-(1 << 70)));
    assert_eq!(a[4], &Node::Bool(true));
    assert_eq!(a[5], &Node::None);
    assert_eq!(a[6], &Node::Float(1.5));
    assert_eq!(a[7], &Node::Object);
    let Node::Tuple(pair) = a[8] else {
        panic!("not a tuple: {:?}", a[8]);
    };
    let pair: Vec<&Node> = pair.iter().map(|&i| p.node(i)).collect();
    assert_eq!(pair, [&Node::Int(1), &Node::Int(2)]);
    assert_eq!(a[9], &Node::Object);
    assert_eq!(p.node(top[1].1), &Node::Str("é".into()));
}

#[test]
fn reads_what_cpython_writes_in_protocols_0_and_2() {
    let p0 = b"(dp0\nVa\np1\n(lp2\nI1\naI-5\naL1180591620717411303424L\naL-1180591620717411303424L\naI01\naNaF1.5\nac_codecs\nencode\np3\n(Vxy\np4\nVlatin1\np5\ntp6\nRp7\na(I1\nI2\ntp8\nac__builtin__\nset\np9\n((lp10\nI3\natp11\nRp12\nasVb\np13\nV\xe9\np14\ns.";
    let p2 = b"\x80\x02}q\x00(X\x01\x00\x00\x00aq\x01]q\x02(K\x01J\xfb\xff\xff\xff\x8a\t\x00\x00\x00\x00\x00\x00\x00\x00@\x8a\t\x00\x00\x00\x00\x00\x00\x00\x00\xc0\x88NG?\xf8\x00\x00\x00\x00\x00\x00c_codecs\nencode\nq\x03X\x02\x00\x00\x00xyq\x04X\x06\x00\x00\x00latin1q\x05\x86q\x06Rq\x07K\x01K\x02\x86q\x08c__builtin__\nfrozenset\nq\t]q\nK\x03a\x85q\x0bRq\x0ceX\x01\x00\x00\x00bq\rX\x02\x00\x00\x00\xc3\xa9q\x0eu.";
    for bytes in [&p0[..], &p2[..]] {
        let p = read_bytes(bytes).unwrap();
        check_python_value(&p);
    }
}

#[test]
fn a_memo_reference_shares_the_node() {
    // `x = [7]; pickle.dumps([x, x], protocol=4)`.
    let p = read_bytes(b"\x80\x04\x95\x0c\x00\x00\x00\x00\x00\x00\x00]\x94(]\x94K\x07ah\x01e.")
        .unwrap();
    let Node::List(outer) = p.node(p.root) else {
        panic!("not a list");
    };
    assert_eq!(outer.len(), 2);
    assert_eq!(outer[0], outer[1], "both items are the one list");
    assert_eq!(items(&p, outer[0]), [&Node::Int(7)]);
}

#[test]
fn ints_past_128_bits_keep_their_sign() {
    // LONG1 of 17 bytes: 2^128 and -2^128 - 1.
    let mut big = vec![0x80, 0x02, 0x8a, 17];
    big.extend([0; 16]);
    big.extend([1, b'.']);
    let p = read_bytes(&big).unwrap();
    assert_eq!(
        p.node(p.root),
        &Node::Big {
            negative: false,
            bytes: 17
        }
    );
    let mut minus = vec![0x80, 0x02, 0x8a, 17];
    minus.extend([0xff; 16]);
    minus.extend([0xfe, b'.']);
    let p = read_bytes(&minus).unwrap();
    assert_eq!(
        p.node(p.root),
        &Node::Big {
            negative: true,
            bytes: 17
        }
    );
}

#[test]
fn malformed_pickles_say_where_and_what() {
    let cases: [(&[u8], &str); 6] = [
        (b"\x80\x02]", "without its STOP"),
        (b"\x80\x02a.", "empty stack"),
        (b"\x80\x02K\x01K\x02u.", "needs a MARK"),
        (b"\x80\x02h\x05.", "memo entry 5"),
        (b"\x80\x02X\xff\xff\xff\x7fab", "ends inside"),
        (b"\x80\x02\xff.", "unknown opcode 0xff"),
    ];
    for (bytes, expected) in cases {
        let e = read_bytes(bytes).unwrap_err();
        assert!(e.message.contains(expected), "{bytes:?}: {e:?}");
    }
    assert_eq!(read_bytes(b"\x80\x02a.").unwrap_err().offset, 2);
}

/// PyTorch's own snapshot ends well inside the memory bound (the allowance only covers the
/// first bytes of any pickle).
#[test]
fn a_real_snapshot_holds_a_few_bytes_per_byte_read() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../traces/snapshot-small.pickle"
    );
    let Ok(bytes) = std::fs::read(path) else {
        eprintln!("skipped: no traces/snapshot-small.pickle");
        return;
    };
    let p = read(&bytes[..]).unwrap();
    assert!(matches!(p.node(p.root), Node::Dict(_)));
    assert_eq!(p.read, bytes.len() as u64);
    assert!(
        p.held <= MEMORY_PER_INPUT_BYTE / 2 * p.read,
        "{} bytes held for {} read",
        p.held,
        p.read
    );
}
