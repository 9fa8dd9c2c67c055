// The soak and fault suite: a real `lmhost serve` on loopback under mixed load from many
// clients while hostile ones misbehave, then SIGTERM.
//
// usage: node soak.mjs LMHOST MODEL_DIR [--proto http|https] [--seconds N] [--clients N]
// (MODEL_DIR without a tokenizer.json gets the fetched Qwen3 one: tests/data/e2e)
//
// Load: --clients clients (64) in a loop, each request picking chat or completion, streamed or
// not, greedy or sampled, a prompt and max_tokens; 15% of streams hang up after their first
// chunk. Over HTTPS with an API key, or plain HTTP with one. Faults meanwhile: readers that
// stop reading a stream (with logprobs, so it outgrows the server's per-connection cap), slow
// senders (a byte a second: the server's --timeout closes them), 1,000 idle connections,
// oversized headers and bodies, malformed HTTP, TLS garbage and plaintext on the TLS port (or
// TLS on the plain port), a backend move under load. A first phase checks the limits on a
// small server: a full queue answers 503 with Retry-After, --rate-limit 429 with
// Retry-After, --max-connections holds further connections until some close.
//
// Checks: every completed greedy request returns the text it returned alone before the load;
// /health answers within 1 s throughout; the server's resident memory at the end is within
// 10% of its value after warm-up; its open descriptors return to where they were before the
// load; the log (at LMHOST_LOG=2) holds no key and no prompt; /metrics counts connections and
// the slow requests cut off; SIGTERM with requests in flight answers each of them in full and
// exits 0. Prints
// throughput and p50/p99 time to first token and per token; exit 0 when every check holds.
import { spawn, execFileSync } from 'node:child_process';
import fs from 'node:fs';
import http from 'node:http';
import https from 'node:https';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import tls from 'node:tls';

const [lmhost, modelArg, ...rest] = process.argv.slice(2);
const opt = { proto: 'https', seconds: 60, clients: 64 };
for (let i = 0; i < rest.length; i++) {
  const [k, v] = rest[i].includes('=') ? rest[i].split('=') : [rest[i], rest[++i]];
  opt[k.replace(/^--/, '')] = k === '--proto' ? v : Number(v);
}
if (process.env.SOAK_SECONDS) opt.seconds = Number(process.env.SOAK_SECONDS);
const secure = opt.proto === 'https';
const KEY = 'soak-key', ADMIN = 'soak-admin', TIMEOUT = 4;
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'lmhost-soak-'));
// A model folder without a tokenizer (tests/data/e2e: Qwen3's shape, random weights) gets
// the fetched Qwen3 tokenizer and template beside it, as the e2e tests give it.
let model = modelArg;
if (!fs.existsSync(path.join(model, 'tokenizer.json'))) {
  const tok = path.join(process.env.LMHOST_TOKENIZERS || path.join(os.homedir(), '.cache/lmhost/tokenizers'), 'qwen3');
  model = path.join(tmp, 'model');
  fs.mkdirSync(model);
  for (const f of fs.readdirSync(modelArg)) fs.symlinkSync(path.resolve(modelArg, f), path.join(model, f));
  for (const f of ['tokenizer.json', 'tokenizer_config.json']) fs.symlinkSync(path.join(tok, f), path.join(model, f));
}
let failures = 0;
const fail = (what) => { failures++; console.log('FAIL: ' + what); };
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const now = () => performance.now();

let ca = null;
if (secure) {
  execFileSync('openssl', ['req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes',
    '-keyout', path.join(tmp, 'key.pem'), '-out', path.join(tmp, 'cert.pem'), '-days', '1', '-subj', '/CN=127.0.0.1',
    '-addext', 'subjectAltName=IP:127.0.0.1'], { stdio: 'ignore' });
  ca = fs.readFileSync(path.join(tmp, 'cert.pem'));
}

function startServer(extra, tlsOn) {
  const args = ['serve', '--model', model, '--port', '0', '--api-key', KEY, '--admin-key', ADMIN,
    '--timeout', String(TIMEOUT), '--shutdown-grace', '30', '--max-tokens', '64', '--prefix-cache-mb', '0', ...extra];
  if (tlsOn) args.push('--tls-cert', path.join(tmp, 'cert.pem'), '--tls-key', path.join(tmp, 'key.pem'));
  const p = spawn(lmhost, args, { stdio: ['ignore', 'ignore', 'pipe'], env: { ...process.env, LMHOST_LOG: '2' } });
  p.log = '';
  return new Promise((resolve, reject) => {
    const t = setTimeout(() => reject(new Error('server did not start: ' + p.log)), 60000);
    p.stderr.on('data', (d) => {
      p.log += d;
      const m = /serving \S+ on (https?):\/\/[^:]+:(\d+)/.exec(p.log);
      if (m && !p.port) { clearTimeout(t); p.port = Number(m[2]); resolve(p); }
    });
    p.on('exit', (code, sig) => { p.code = code; p.sig = sig; if (!p.port) reject(new Error(`server exited ${code}: ${p.log}`)); });
  });
}

const procStatus = (pid) => fs.readFileSync(`/proc/${pid}/status`, 'utf8');
const rssKiB = (pid) => Number(/VmRSS:\s+(\d+)/.exec(procStatus(pid))[1]);
const fdCount = (pid) => fs.readdirSync(`/proc/${pid}/fd`).length;

// One request; resolves {status, headers, text, ttft, gaps, error}. abortAfter: hang up after
// that many content chunks of a stream.
function request(port, tlsOn, agent, method, p, body, { key = KEY, abortAfter = 0, headers = {} } = {}) {
  return new Promise((resolve) => {
    const t0 = now();
    const mod = tlsOn ? https : http;
    const data = body === undefined ? undefined : JSON.stringify(body);
    const r = mod.request({ host: '127.0.0.1', port, method, path: p, agent, ca, timeout: 120000,
      headers: { ...(key ? { Authorization: 'Bearer ' + key } : {}), ...(data ? { 'Content-Type': 'application/json' } : {}), ...headers } },
    (res) => {
      let raw = '', text = '', chunks = 0, ttft = -1, last = 0, buf = '', done = false, tokens = 0;
      const gaps = [];
      res.setEncoding('utf8');
      res.on('data', (d) => {
        raw += d;
        if (!/text\/event-stream/.test(res.headers['content-type'] || '')) return;
        buf += d;
        let i;
        while ((i = buf.indexOf('\n\n')) >= 0) {
          const ev = buf.slice(0, i); buf = buf.slice(i + 2);
          if (!ev.startsWith('data: ')) continue;
          if (ev === 'data: [DONE]') { done = true; continue; }
          let o; try { o = JSON.parse(ev.slice(6)); } catch { text += '\u0000bad-json'; continue; }
          if (o.error) { text += '\u0000error:' + o.error.message; continue; }
          const c = o.choices?.[0];
          const piece = c?.delta?.content ?? c?.text ?? '';
          if (!piece) continue;
          const t = now();
          if (ttft < 0) ttft = t - t0; else gaps.push(t - last);
          last = t;
          text += piece;
          tokens++;
          if (abortAfter && ++chunks >= abortAfter) { r.destroy(); resolve({ status: res.statusCode, cut: true }); }
        }
      });
      res.on('end', () => {
        let out = text;
        if (!/text\/event-stream/.test(res.headers['content-type'] || '')) {
          try {
            const o = JSON.parse(raw);
            out = o.choices?.[0]?.message?.content ?? o.choices?.[0]?.text ?? raw;
            tokens = o.usage?.completion_tokens ?? 0;
          } catch { out = raw; }
          ttft = now() - t0;
        } else if (!done) out += '\u0000no-[DONE]';
        resolve({ status: res.statusCode, headers: res.headers, text: out, ttft, gaps, tokens, total: now() - t0 });
      });
      res.on('error', (e) => resolve({ status: res.statusCode, error: String(e) }));
    });
    r.on('error', (e) => resolve({ status: 0, error: String(e) }));
    r.on('timeout', () => { r.destroy(); resolve({ status: 0, error: 'client timeout' }); });
    if (data) r.write(data);
    r.end();
  });
}

// A raw connection (TLS or not) that sends bytes and reports when the server closes it.
function raw(port, tlsOn, send, { slowMs = 0 } = {}) {
  return new Promise((resolve) => {
    const t0 = now();
    const s = tlsOn ? tls.connect({ host: '127.0.0.1', port, ca }) : net.connect({ host: '127.0.0.1', port });
    let got = '';
    s.on('data', (d) => { got += d; });
    s.on('error', () => {});
    s.on('close', () => resolve({ got, closedAfter: now() - t0 }));
    s.on(tlsOn ? 'secureConnect' : 'connect', async () => {
      if (!slowMs) { s.write(send); return; }
      for (const ch of send) { if (s.destroyed) return; s.write(ch); await sleep(slowMs); }
    });
    s.setTimeout(60000, () => s.destroy());
  });
}

// A client that sends one request and never reads, with a 4 KiB receive buffer.
const STALLED_PY = `
import socket, ssl, sys, time
port, ca, req = int(sys.argv[1]), sys.argv[2], sys.argv[3].encode()
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
s.connect(("127.0.0.1", port))
if ca:
    s = ssl.create_default_context(cafile=ca).wrap_socket(s, server_hostname="127.0.0.1")
s.sendall(req)
time.sleep(float(sys.argv[4]))
s.settimeout(5)
got = 0
try:
    while True:
        d = s.recv(65536)
        if not d:
            break
        got += len(d)
except (ConnectionError, ssl.SSLError, OSError) as e:
    if isinstance(e, socket.timeout):
        print("open", got); sys.exit(1)
print("closed", got)
`;

const pct = (a, q) => { if (!a.length) return NaN; const s = [...a].sort((x, y) => x - y); return s[Math.min(s.length - 1, Math.floor(q * s.length))]; };

const PROMPTS = ['Hello! Who are you?', 'What does the word harbor mean?', 'Tell me a quote.', 'What is the capital of France?',
  'How do I install a package in Debian?', 'Tell me something interesting.', 'What is a synonym of happy?', 'Write one sentence about the sea.'];
const bodyFor = (kind, i, greedy, stream, seed) => ({
  ...(kind === 'chat' ? { messages: [{ role: 'user', content: PROMPTS[i] }] } : { prompt: PROMPTS[i] }),
  max_tokens: 24, temperature: greedy ? 0 : 0.8, ...(greedy ? {} : { seed }), stream,
});

// ---- phase 1: the limits, on a small plain-HTTP server --------------------------------------
async function limitsPhase() {
  const srv = await startServer(['--parallel', '1', '--queue', '1', '--rate-limit', '20', '--max-connections', '6'], false);
  const agent = new http.Agent({ keepAlive: false });
  try {
    const long = bodyFor('completion', 0, true, false);
    long.max_tokens = 200; long.ignore_eos = true;
    const rs = await Promise.all(Array.from({ length: 5 }, () => request(srv.port, false, agent, 'POST', '/v1/completions', long)));
    const busy = rs.filter((r) => r.status === 503);
    if (!busy.length) fail('a full queue did not answer 503: ' + rs.map((r) => r.status));
    else if (!/^\d+$/.test(busy[0].headers['retry-after'] || '')) fail('503 without Retry-After');
    if (rs.some((r) => r.status !== 200 && r.status !== 503)) fail('queue phase: ' + rs.map((r) => r.status));
    let limited = null;
    for (let i = 0; i < 30 && !limited; i++) {
      const r = await request(srv.port, false, agent, 'GET', '/v1/models');
      if (r.status === 429) limited = r;
    }
    if (!limited) fail('--rate-limit 20 never answered 429');
    else if (!(Number(limited.headers['retry-after']) >= 1)) fail('429 without Retry-After');
    const h = JSON.parse((await request(srv.port, false, agent, 'GET', '/health')).text);
    if (h.limits?.max_connections !== 6 || h.limits?.rate_limit !== 20) fail('/health limits: ' + JSON.stringify(h.limits));
    // --max-connections 6: with 8 idle connections open, a new request waits for the
    // server's --timeout to close some, then is answered
    const idle = Array.from({ length: 8 }, () => raw(srv.port, false, ''));
    await sleep(300);
    const t0 = now();
    const r = await request(srv.port, false, agent, 'GET', '/health');
    const waited = (now() - t0) / 1000;
    if (r.status !== 200) fail('a request after the connection limit was not answered: ' + r.status);
    if (waited < TIMEOUT - 1.5) fail(`a request beyond --max-connections was served at once (${waited.toFixed(1)} s)`);
    if (!/--max-connections/.test(srv.log)) fail('no log line at the connection limit');
    await Promise.all(idle);
    console.log(`limits: queue full -> 503 Retry-After ${busy[0]?.headers['retry-after']}, rate limit -> 429 Retry-After ${limited?.headers['retry-after']}, ` +
      `--max-connections 6 held a 9th connection ${waited.toFixed(1)} s`);
  } finally {
    srv.kill('SIGKILL');
  }
}

// ---- phase 2: the soak -------------------------------------------------------------------
async function soakPhase() {
  const srv = await startServer(['--parallel', '8', '--queue', '1024', '--max-connections', '4000'], secure);
  const pid = srv.pid, port = srv.port;
  const Agent = secure ? https.Agent : http.Agent;
  const agent = new Agent({ keepAlive: true, maxSockets: opt.clients + 8, ca });
  const stats = { done: 0, greedy: 0, cut: 0, tokens: 0, errors: 0, ttft: [], gaps: [] };

  // references: each greedy request alone, before the load
  const ref = {};
  for (const kind of ['chat', 'completion'])
    for (let i = 0; i < PROMPTS.length; i++) {
      const r = await request(port, secure, agent, 'POST', kind === 'chat' ? '/v1/chat/completions' : '/v1/completions', bodyFor(kind, i, true, false));
      if (r.status !== 200) { fail(`reference ${kind} ${i}: ${r.status} ${r.text || r.error}`); return srv; }
      ref[kind + i] = r.text;
    }

  let healthMax = 0, healthFail = 0, stop = false;
  const healthLoop = (async () => {
    const a = new Agent({ keepAlive: false, ca });
    while (!stop) {
      const t0 = now();
      const r = await request(port, secure, a, 'GET', '/health', undefined, { key: null });
      const ms = now() - t0;
      healthMax = Math.max(healthMax, ms);
      if (r.status !== 200 || ms > 1000) { healthFail++; if (healthFail <= 3) fail(`/health: ${r.status} after ${ms.toFixed(0)} ms ${r.error || ''}`); }
      await sleep(250);
    }
  })();

  const t0 = now(), end = t0 + opt.seconds * 1000;
  let seed = 1;
  const client = async (c) => {
    while (now() < end) {
      const kind = Math.random() < 0.5 ? 'chat' : 'completion';
      const i = Math.floor(Math.random() * PROMPTS.length);
      const greedy = Math.random() < 0.6, stream = Math.random() < 0.5;
      const cut = stream && Math.random() < 0.15;
      const r = await request(port, secure, agent, 'POST', kind === 'chat' ? '/v1/chat/completions' : '/v1/completions',
        bodyFor(kind, i, greedy, stream, seed++), { abortAfter: cut ? 1 : 0 });
      if (r.cut) { stats.cut++; continue; }
      if (r.status !== 200 || r.error) { stats.errors++; if (stats.errors <= 5) fail(`client ${c} at ${((now() - t0) / 1000).toFixed(1)} s: ${r.status} ${stream ? 'stream' : ''} ${r.error || r.text?.slice(0, 200)}`); continue; }
      stats.done++;
      stats.tokens += r.tokens;
      if (stream && r.ttft >= 0) { stats.ttft.push(r.ttft); stats.gaps.push(...r.gaps); }
      if (greedy) {
        stats.greedy++;
        if (r.text !== ref[kind + i]) { stats.errors++; if (stats.errors <= 5) fail(`greedy ${kind} ${i}${stream ? ' streamed' : ''}: ${JSON.stringify(r.text)} != ${JSON.stringify(ref[kind + i])}`); }
      }
    }
  };

  const faults = (async () => {
    await sleep(opt.seconds * 100);
    // readers that stop reading: a long stream with logprobs, never read, from a socket with
    // a small receive buffer (so the kernel's buffers do not take it all)
    const stalled = [];
    for (let k = 0; k < 2; k++) {
      const body = JSON.stringify({ prompt: PROMPTS[k], max_tokens: 900, ignore_eos: true, stream: true, logprobs: 20, temperature: 0 });
      const req = `POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${KEY}\r\nContent-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`;
      const p = spawn('python3', ['-c', STALLED_PY, String(port), secure ? path.join(tmp, 'cert.pem') : '', req, String(TIMEOUT + 6)], { stdio: ['ignore', 'pipe', 'inherit'] });
      p.out = '';
      p.stdout.on('data', (d) => { p.out += d; });
      p.done = new Promise((r) => p.on('exit', (c) => r(c)));
      stalled.push(p);
    }
    // slow senders: a byte every 700 ms; --timeout closes them
    const slow = Array.from({ length: 3 }, () => raw(port, secure, 'POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n', { slowMs: 700 }));
    // 1,000 idle connections
    const idle = Array.from({ length: 1000 }, () => raw(port, false, ''));
    // oversized headers and bodies, malformed HTTP
    const big = await request(port, secure, agent, 'GET', '/health', undefined, { headers: { 'X-Big': 'x'.repeat(40000) } });
    if (big.status !== 0 && big.status < 400) fail('a 40 KB header was accepted: ' + big.status);
    const huge = await raw(port, secure, `POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${KEY}\r\nContent-Length: 100000000\r\n\r\n` + 'x'.repeat(65536));
    if (!/^HTTP\/1\.1 413/.test(huge.got)) fail('a 100 MB body: ' + huge.got.slice(0, 80));
    for (const junk of ['BLAH\r\n\r\n', 'GET / HTTP/1.1\r\nHost\r\n\r\n', 'GET /\x00\x01 HTTP/9.9\r\n\r\n', '\x16\x03\x01\x00\x05hello', 'POST /v1/completions HTTP/1.1\r\nContent-Length: -5\r\n\r\n']) {
      const r = await raw(port, secure, junk);
      if (/^HTTP\/1\.1 2/.test(r.got)) fail('malformed request answered 2xx: ' + JSON.stringify(junk));
    }
    // the wrong protocol on the port: plaintext on TLS, TLS garbage on plain
    const wrong = await raw(port, false, secure ? 'GET /health HTTP/1.1\r\nHost: x\r\n\r\n' : '\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03' + 'z'.repeat(300));
    if (/^HTTP\/1\.1 2/.test(wrong.got)) fail('the wrong protocol got a 2xx');
    if (secure) { // a TLS record of garbage, and a handshake cut short, on the TLS port
      await raw(port, false, '\x16\x03\x01\x00\x40' + '\xff'.repeat(64));
      await raw(port, false, '\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03');
    }
    // a backend move under load
    const mv = await request(port, secure, agent, 'POST', '/admin/backend', { backend: 'cpu' }, { key: ADMIN });
    if (mv.status !== 200) fail('backend move: ' + mv.status + ' ' + (mv.text || mv.error));
    const closed = await Promise.all(slow);
    const met = (await request(port, secure, agent, 'GET', '/metrics', undefined, { key: null })).text || '';
    if (!/lmhost_slow_requests_closed_total [1-9]/.test(met) || !/lmhost_connections \d+/.test(met))
      fail('/metrics does not count connections and slow requests: ' + met.match(/lmhost_(connections|slow)[^\n]*/g));
    for (const c of closed) if (c.closedAfter > (TIMEOUT + 3) * 1000) fail(`a slow sender held its connection ${(c.closedAfter / 1000).toFixed(1)} s`);
    // each idle one closed by --timeout (a connection the listen backlog dropped would wait
    // for its SYN to be resent: 1, 3, 7... s)
    const idleLast = Math.max(...(await Promise.all(idle)).map((c) => c.closedAfter));
    if (idleLast > (TIMEOUT + 4) * 1000) fail(`an idle connection was closed only after ${(idleLast / 1000).toFixed(1)} s`);
    await sleep((TIMEOUT + 2) * 1000);
    for (const p of stalled) {
      const code = await p.done;
      if (code !== 0) fail('a reader that stopped reading kept its connection: ' + p.out.trim());
    }
    const stalledBytes = stalled.map((p) => p.out.trim().split(' ')[1]).join('/');
    return { slow: closed.map((c) => c.closedAfter), stalledBytes, idleLast };
  })();

  // resident memory after warm-up (a third of the run), and at the end
  let rssWarm = 0;
  const rssSeries = [];
  const warm = (async () => {
    await sleep(opt.seconds * 330);
    rssWarm = rssKiB(pid);
    while (now() < end - 1000) { rssSeries.push(rssKiB(pid)); await sleep(Math.min(10000, opt.seconds * 50)); }
  })();
  const fdBase = fdCount(pid);
  await Promise.all(Array.from({ length: opt.clients }, (_, c) => client(c)));
  const elapsed = (now() - t0) / 1000;
  const { slow: slowClosed, stalledBytes, idleLast } = await faults;
  await warm;
  agent.destroy();
  await sleep((TIMEOUT + 1) * 1000); // the server's keep-alive timeout closes what is left
  const rssEnd = rssKiB(pid), fdEnd = fdCount(pid);
  if (fdEnd > fdBase + 2) fail(`open descriptors ${fdBase} before the load, ${fdEnd} after`);
  const growth = (rssEnd - rssWarm) / rssWarm;
  // (under ASan freed memory waits in its quarantine, so resident memory says nothing there)
  if (growth > 0.10 && !process.env.ASAN_OPTIONS) fail(`resident memory grew ${(growth * 100).toFixed(1)}% after warm-up (${rssWarm} -> ${rssEnd} KiB)`);

  // SIGTERM with requests in flight: each answered in full, exit 0
  const inflight = Array.from({ length: 12 }, (_, k) => request(port, secure, new Agent({ keepAlive: false, ca }), 'POST', '/v1/completions',
    { ...bodyFor('completion', k % PROMPTS.length, true, k % 2 === 0), max_tokens: 24 }));
  await sleep(150);
  stop = true; // after SIGTERM /health answers 503 "draining", then (no --drain-delay) nothing
  await healthLoop;
  srv.kill('SIGTERM');
  const answers = await Promise.all(inflight);
  const exit = await new Promise((r) => (srv.code !== undefined ? r(srv.code) : srv.on('exit', (c) => r(c))));
  let good = 0;
  answers.forEach((r, k) => {
    if (r.status === 200 && r.text === ref['completion' + (k % PROMPTS.length)]) good++;
    else fail(`in flight at SIGTERM: ${r.status} ${r.error || JSON.stringify(r.text)}`);
  });
  if (exit !== 0) fail('exit status after SIGTERM: ' + exit + ' ' + srv.log.slice(-500));

  if ([KEY, ADMIN, ...PROMPTS].some((x) => srv.log.includes(x))) fail('the log (LMHOST_LOG=2) holds a key or a prompt');
  const tps = stats.tokens / elapsed;
  if (process.env.SOAK_LOG) fs.writeFileSync(process.env.SOAK_LOG, srv.log);
  console.log(`soak ${opt.proto}: ${opt.seconds} s, ${opt.clients} clients: ${stats.done} requests (${stats.greedy} greedy checked, ${stats.cut} hung up), ` +
    `${(stats.done / elapsed).toFixed(1)} req/s, ${tps.toFixed(0)} tokens/s; TTFT p50 ${pct(stats.ttft, 0.5).toFixed(0)} ms p99 ${pct(stats.ttft, 0.99).toFixed(0)} ms; ` +
    `per token p50 ${pct(stats.gaps, 0.5).toFixed(1)} ms p99 ${pct(stats.gaps, 0.99).toFixed(1)} ms; /health max ${healthMax.toFixed(0)} ms; ` +
    `RSS after warm-up ${(rssWarm / 1024).toFixed(1)} MiB, under load ${(Math.min(...rssSeries) / 1024).toFixed(1)}..${(Math.max(...rssSeries) / 1024).toFixed(1)} MiB, at the end ${(rssEnd / 1024).toFixed(1)} MiB (${(growth * 100).toFixed(1)}%); fds ${fdBase} -> ${fdEnd}; ` +
    `slow senders closed after ${slowClosed.map((x) => (x / 1000).toFixed(1)).join('/')} s, 1,000 idle ones within ${(idleLast / 1000).toFixed(1)} s; stalled readers cut after ${stalledBytes} bytes; SIGTERM: ${good}/12 answered, exit ${exit}; ${failures} failures`);
  return srv;
}

try {
  await limitsPhase();
  await soakPhase();
} catch (e) {
  fail(String(e.stack || e));
}
fs.rmSync(tmp, { recursive: true, force: true });
process.exit(failures ? 1 : 0);
