//! A raw CurveZMQ client over plain TCP, for tests that need to send what
//! libzmq would never send (frames flagged MORE inside the box, without
//! end).
//!
//! ZMTP 3.0 greeting with mechanism `CURVE`, then the handshake of RFC 26
//! (<http://rfc.zeromq.org/spec:26>; libzmq's `curve_client.cpp` and
//! `curve_client_tools.hpp` are the reference): HELLO, WELCOME, INITIATE,
//! READY. After it, every frame is a MESSAGE command whose box holds one
//! flags byte (MORE = 1) and the payload.
//!
//! The crypto is libsodium's `crypto_box`, the static library that zmq-sys
//! links into this test binary for libzmq's CURVE (vendor/zeromq-src,
//! EMQ-PATCH.md "CURVE"): the few functions used are declared below.
//! libsodium's "easy" boxes are NaCl boxes without the 16 leading zero
//! bytes (MAC, then ciphertext), which is what CurveZMQ puts on the wire.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::raw::{c_int, c_uchar, c_ulonglong};

/// Bytes of a Curve25519 key.
pub const KEY: usize = 32;
/// Bytes a box adds to its plaintext (Poly1305 MAC).
const MAC: usize = 16;

unsafe extern "C" {
    fn sodium_init() -> c_int;
    fn crypto_box_keypair(pk: *mut c_uchar, sk: *mut c_uchar) -> c_int;
    fn crypto_box_easy(
        c: *mut c_uchar,
        m: *const c_uchar,
        mlen: c_ulonglong,
        n: *const c_uchar,
        pk: *const c_uchar,
        sk: *const c_uchar,
    ) -> c_int;
    fn crypto_box_open_easy(
        m: *mut c_uchar,
        c: *const c_uchar,
        clen: c_ulonglong,
        n: *const c_uchar,
        pk: *const c_uchar,
        sk: *const c_uchar,
    ) -> c_int;
    fn crypto_box_beforenm(k: *mut c_uchar, pk: *const c_uchar, sk: *const c_uchar) -> c_int;
    fn crypto_box_easy_afternm(
        c: *mut c_uchar,
        m: *const c_uchar,
        mlen: c_ulonglong,
        n: *const c_uchar,
        k: *const c_uchar,
    ) -> c_int;
    fn crypto_box_open_easy_afternm(
        m: *mut c_uchar,
        c: *const c_uchar,
        clen: c_ulonglong,
        n: *const c_uchar,
        k: *const c_uchar,
    ) -> c_int;
    fn randombytes_buf(buf: *mut c_uchar, size: usize);
}

/// A Curve25519 key pair (`public`, `secret`), fresh from libsodium.
pub fn keypair() -> ([u8; KEY], [u8; KEY]) {
    let (mut public, mut secret) = ([0u8; KEY], [0u8; KEY]);
    // SAFETY: sodium_init may be called any number of times; both buffers
    // are crypto_box_PUBLICKEYBYTES / SECRETKEYBYTES (32) long.
    unsafe {
        assert!(sodium_init() >= 0, "libsodium failed to initialise");
        assert_eq!(crypto_box_keypair(public.as_mut_ptr(), secret.as_mut_ptr()), 0);
    }
    (public, secret)
}

/// `Box[plain](sk -> pk)` with the 24-byte `nonce`: MAC then ciphertext.
fn seal(plain: &[u8], nonce: &[u8; 24], pk: &[u8; KEY], sk: &[u8; KEY]) -> Vec<u8> {
    let mut out = vec![0u8; plain.len() + MAC];
    // SAFETY: out has room for the plaintext plus the MAC; the lengths are
    // those of the slices passed.
    let rc = unsafe {
        crypto_box_easy(
            out.as_mut_ptr(),
            plain.as_ptr(),
            plain.len() as c_ulonglong,
            nonce.as_ptr(),
            pk.as_ptr(),
            sk.as_ptr(),
        )
    };
    assert_eq!(rc, 0, "crypto_box_easy");
    out
}

/// Opens `Box[..](pk -> sk)`; `None` when it does not authenticate.
fn open(boxed: &[u8], nonce: &[u8; 24], pk: &[u8; KEY], sk: &[u8; KEY]) -> Option<Vec<u8>> {
    let mut out = vec![0u8; boxed.len().checked_sub(MAC)?];
    // SAFETY: out is the box's length less the MAC, as the function writes.
    let rc = unsafe {
        crypto_box_open_easy(
            out.as_mut_ptr(),
            boxed.as_ptr(),
            boxed.len() as c_ulonglong,
            nonce.as_ptr(),
            pk.as_ptr(),
            sk.as_ptr(),
        )
    };
    (rc == 0).then_some(out)
}

/// A 24-byte nonce: a 16-byte prefix and an 8-byte big-endian short nonce.
fn nonce(prefix: &[u8; 16], short: u64) -> [u8; 24] {
    let mut n = [0u8; 24];
    n[..16].copy_from_slice(prefix);
    n[16..].copy_from_slice(&short.to_be_bytes());
    n
}

/// Sends a ZMTP 3.0 greeting as client (signature, version 3.0,
/// `mechanism`, as-server 0, filler) on `s`, reads the peer's and checks it
/// is ZMTP 3; returns it.
pub fn zmtp3_greeting(s: &mut TcpStream, mechanism: &str) -> [u8; 64] {
    let mut greeting = vec![0xff, 0, 0, 0, 0, 0, 0, 0, 0, 0x7f, 3, 0];
    greeting.extend_from_slice(mechanism.as_bytes());
    greeting.resize(64, 0);
    s.write_all(&greeting).expect("greeting");
    let mut theirs = [0u8; 64];
    s.read_exact(&mut theirs).expect("the peer's greeting");
    assert_eq!((theirs[0], theirs[9], theirs[10]), (0xff, 0x7f, 3), "a ZMTP 3 greeting");
    theirs
}

/// One ZMTP 3.0 frame: `command` sets the COMMAND flag (else the frame is a
/// data frame, no MORE: CurveZMQ carries MORE inside the box).
pub fn zmtp_frame(command: bool, body: &[u8]) -> Vec<u8> {
    let mut flags = if command { 0x04 } else { 0x00 };
    let mut out = Vec::with_capacity(body.len() + 9);
    if let Ok(short) = u8::try_from(body.len()) {
        out.push(flags);
        out.push(short);
    } else {
        flags |= 0x02;
        out.push(flags);
        out.extend_from_slice(&(body.len() as u64).to_be_bytes());
    }
    out.extend_from_slice(body);
    out
}

/// Reads one ZMTP 3.0 frame: (flags, body).
fn read_frame(s: &mut TcpStream) -> std::io::Result<(u8, Vec<u8>)> {
    let mut head = [0u8; 2];
    s.read_exact(&mut head)?;
    let size = if head[0] & 0x02 != 0 {
        let mut rest = [0u8; 7];
        s.read_exact(&mut rest)?;
        let mut long = [0u8; 8];
        long[0] = head[1];
        long[1..].copy_from_slice(&rest);
        usize::try_from(u64::from_be_bytes(long)).expect("frame size fits")
    } else {
        usize::from(head[1])
    };
    assert!(size <= 1 << 20, "a frame of {size} bytes from the server");
    let mut body = vec![0u8; size];
    s.read_exact(&mut body)?;
    Ok((head[0], body))
}

/// A ZMTP property (name-length byte, name, 4-byte value length, value).
fn property(name: &str, value: &[u8]) -> Vec<u8> {
    let mut out = vec![u8::try_from(name.len()).expect("short name")];
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(&u32::try_from(value.len()).expect("short value").to_be_bytes());
    out.extend_from_slice(value);
    out
}

/// A CurveZMQ connection past its handshake.
pub struct CurveClient {
    /// The TCP connection (timeouts as the caller set them).
    pub stream: TcpStream,
    /// Precomputed key of (S', c') for the MESSAGE boxes.
    precom: [u8; KEY],
    /// The next short nonce this client sends (HELLO used 1, INITIATE 2).
    next_nonce: u64,
}

impl CurveClient {
    /// Does the greeting and the CurveZMQ handshake on `stream` against a
    /// server whose long-term public key is `server_key`, as a
    /// `socket_type` socket (`DEALER`...), with a fresh long-term client
    /// key pair (a server without ZAP accepts any). Panics, saying which
    /// step, if the server does not follow RFC 26.
    pub fn handshake(stream: TcpStream, server_key: &[u8; KEY], socket_type: &str) -> CurveClient {
        let (client_pk, client_sk) = keypair();
        CurveClient::handshake_as(stream, server_key, (&client_pk, &client_sk), socket_type)
    }

    /// Like [`CurveClient::handshake`], with the long-term client key pair
    /// `client` (`public`, `secret`): for a server that checks client keys.
    pub fn handshake_as(
        mut stream: TcpStream,
        server_key: &[u8; KEY],
        client: (&[u8; KEY], &[u8; KEY]),
        socket_type: &str,
    ) -> CurveClient {
        let (client_pk, client_sk) = client;
        let (cn_pk, cn_sk) = keypair();
        let theirs = zmtp3_greeting(&mut stream, "CURVE");
        assert_eq!(&theirs[12..17], b"CURVE", "the server's mechanism");

        // HELLO: version 1.0, 72 bytes of padding, C', short nonce 1,
        // Box[64 zero bytes](C' -> S).
        let mut hello = b"\x05HELLO\x01\x00".to_vec();
        hello.resize(80, 0);
        hello.extend_from_slice(&cn_pk);
        hello.extend_from_slice(&1u64.to_be_bytes());
        hello.extend_from_slice(&seal(&[0u8; 64], &nonce(b"CurveZMQHELLO---", 1), server_key, &cn_sk));
        stream.write_all(&zmtp_frame(true, &hello)).expect("HELLO");

        // WELCOME: 16-byte nonce, Box[S' + cookie](S -> C').
        let (_, welcome) = read_frame(&mut stream).expect("WELCOME");
        assert!(welcome.starts_with(b"\x07WELCOME") && welcome.len() == 168, "a WELCOME: {welcome:?}");
        let mut welcome_nonce = [0u8; 24];
        welcome_nonce[..8].copy_from_slice(b"WELCOME-");
        welcome_nonce[8..].copy_from_slice(&welcome[8..24]);
        let plain = open(&welcome[24..], &welcome_nonce, server_key, &cn_sk).expect("WELCOME box opens");
        let server_cn: [u8; KEY] = plain[..KEY].try_into().expect("S'");
        let cookie = &plain[KEY..KEY + 96];

        // INITIATE: cookie, short nonce 2, Box[C + vouch + metadata](C' -> S')
        // where vouch is a 16-byte nonce and Box[C' + S](C -> S').
        let mut vouch_nonce = [0u8; 24];
        vouch_nonce[..8].copy_from_slice(b"VOUCH---");
        // SAFETY: writes 16 bytes into the 16 left.
        unsafe { randombytes_buf(vouch_nonce[8..].as_mut_ptr(), 16) };
        let mut vouch_plain = cn_pk.to_vec();
        vouch_plain.extend_from_slice(server_key);
        let vouch = seal(&vouch_plain, &vouch_nonce, &server_cn, client_sk);
        let mut inner = client_pk.to_vec();
        inner.extend_from_slice(&vouch_nonce[8..]);
        inner.extend_from_slice(&vouch);
        inner.extend_from_slice(&property("Socket-Type", socket_type.as_bytes()));
        let mut initiate = b"\x08INITIATE".to_vec();
        initiate.extend_from_slice(cookie);
        initiate.extend_from_slice(&2u64.to_be_bytes());
        initiate.extend_from_slice(&seal(&inner, &nonce(b"CurveZMQINITIATE", 2), &server_cn, &cn_sk));
        stream.write_all(&zmtp_frame(true, &initiate)).expect("INITIATE");

        // READY: short nonce, Box[metadata](S' -> C').
        let (_, ready) = read_frame(&mut stream).expect("READY (the server dropped INITIATE?)");
        assert!(ready.starts_with(b"\x05READY") && ready.len() >= 30, "a READY: {ready:?}");
        let ready_nonce = nonce(b"CurveZMQREADY---", u64::from_be_bytes(ready[6..14].try_into().expect("8")));
        open(&ready[14..], &ready_nonce, &server_cn, &cn_sk).expect("READY box opens");

        let mut precom = [0u8; KEY];
        // SAFETY: all three are 32-byte buffers.
        let rc = unsafe { crypto_box_beforenm(precom.as_mut_ptr(), server_cn.as_ptr(), cn_sk.as_ptr()) };
        assert_eq!(rc, 0, "crypto_box_beforenm");
        CurveClient { stream, precom, next_nonce: 3 }
    }

    /// One MESSAGE frame on the wire (ZMTP framing included): `payload`
    /// with MORE when `more`, boxed with the next short nonce. Not sent:
    /// callers batch frames into large writes.
    pub fn message_frame(&mut self, payload: &[u8], more: bool) -> Vec<u8> {
        let short = self.next_nonce;
        self.next_nonce += 1;
        let mut plain = Vec::with_capacity(payload.len() + 1);
        plain.push(u8::from(more));
        plain.extend_from_slice(payload);
        let mut boxed = vec![0u8; plain.len() + MAC];
        let n = nonce(b"CurveZMQMESSAGEC", short);
        // SAFETY: boxed has room for the plaintext plus the MAC.
        let rc = unsafe {
            crypto_box_easy_afternm(
                boxed.as_mut_ptr(),
                plain.as_ptr(),
                plain.len() as c_ulonglong,
                n.as_ptr(),
                self.precom.as_ptr(),
            )
        };
        assert_eq!(rc, 0, "crypto_box_easy_afternm");
        let mut body = b"\x07MESSAGE".to_vec();
        body.extend_from_slice(&short.to_be_bytes());
        body.extend_from_slice(&boxed);
        zmtp_frame(false, &body)
    }

    /// Sends the frames of one complete message.
    pub fn send(&mut self, frames: &[&[u8]]) {
        let mut wire = Vec::new();
        for (i, f) in frames.iter().enumerate() {
            wire.extend(self.message_frame(f, i + 1 < frames.len()));
        }
        self.stream.write_all(&wire).expect("send a message");
    }

    /// Reads one complete message from the server (its MESSAGE commands
    /// opened, until one without MORE).
    pub fn recv(&mut self) -> Vec<Vec<u8>> {
        let mut frames = Vec::new();
        loop {
            let (_, body) = read_frame(&mut self.stream).expect("a MESSAGE from the server");
            assert!(body.starts_with(b"\x07MESSAGE") && body.len() >= 33, "a MESSAGE: {body:?}");
            let n = nonce(b"CurveZMQMESSAGES", u64::from_be_bytes(body[8..16].try_into().expect("8")));
            let boxed = &body[16..];
            let mut plain = vec![0u8; boxed.len() - MAC];
            // SAFETY: plain is the box's length less the MAC.
            let rc = unsafe {
                crypto_box_open_easy_afternm(
                    plain.as_mut_ptr(),
                    boxed.as_ptr(),
                    boxed.len() as c_ulonglong,
                    n.as_ptr(),
                    self.precom.as_ptr(),
                )
            };
            assert_eq!(rc, 0, "a MESSAGE box from the server opens");
            let more = plain[0] & 1 != 0;
            frames.push(plain[1..].to_vec());
            if !more {
                return frames;
            }
        }
    }
}

/// Writes a czmq/pyzmq certificate (`zmq.auth.load_certificate` format) to
/// `path`: the public key, and the secret key when given (`NAME.key_secret`,
/// mode 0600), both in Z85.
pub fn write_cert(path: &std::path::Path, public: &[u8; KEY], secret: Option<&[u8; KEY]>) {
    use std::os::unix::fs::OpenOptionsExt;
    let z85 = |k: &[u8; KEY]| zmq::z85_encode(k).expect("a 32-byte key encodes");
    let mut text = format!("metadata\ncurve\n    public-key = \"{}\"\n", z85(public));
    if let Some(secret) = secret {
        text.push_str(&format!("    secret-key = \"{}\"\n", z85(secret)));
    }
    let mode = if secret.is_some() { 0o600 } else { 0o644 };
    let mut f =
        std::fs::OpenOptions::new().write(true).create_new(true).mode(mode).open(path).expect("create a certificate");
    f.write_all(text.as_bytes()).expect("write a certificate");
}
