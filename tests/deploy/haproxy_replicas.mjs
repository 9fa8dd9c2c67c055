// Three `lmhost serve` replicas behind HAProxy, configured from examples/deploy/haproxy.cfg
// (its global, defaults, frontend and backend sections; loopback addresses, checks every
// 250 ms), under load from 16 clients (greedy chat completions, streamed and not). Mid-load
// replica A gets SIGTERM (it drains: --drain-delay 2) and a second later replica B gets
// SIGKILL. Checks: A answers everything it accepted in full and exits 0; the only failed
// requests are ones HAProxy had on B when it was killed (no more than were in flight
// there); requests begun once the checks have had time to notice go to C; every answer
// equals the one the same request got alone; the example file itself passes `haproxy -c`.
// HAProxy's log (stdout) names the replica of each request by its X-Request-Id.
//
// usage: node haproxy_replicas.mjs LMHOST SOURCE_ROOT
// Exit 77 (skipped) when haproxy is not installed (tools/install-deps.sh installs it).
import { spawn, execFileSync } from 'node:child_process';
import fs from 'node:fs';
import http from 'node:http';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';

const [lmhost, root] = process.argv.slice(2);
// (Debian puts it in /usr/sbin, which a user's PATH may lack)
const haproxy = [...(process.env.PATH || '').split(':'), '/usr/local/sbin', '/usr/sbin'].map((d) => path.join(d, 'haproxy')).find((f) => {
  try { fs.accessSync(f, fs.constants.X_OK); return true; } catch { return false; }
});
if (!haproxy) {
  console.log('SKIP: haproxy is not installed (tools/install-deps.sh installs it)');
  process.exit(77);
}

const DRAIN = 2, CLIENTS = 16, MAX_TOKENS = 40;
const T_TERM = 2500, T_KILL = 3500, T_END = 8000, SETTLE = 1200; // ms from the load's start
const PROMPTS = ['Hello! Who are you?', 'What does the word harbor mean?', 'Tell me something interesting.',
  'Name three colors.', 'Why is the sky blue?', 'Write one sentence about a cat.'];
const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'lmhost-haproxy-'));
const model = path.join(root, 'examples/tiny-chat');
const example = fs.readFileSync(path.join(root, 'examples/deploy/haproxy.cfg'), 'utf8');
let failures = 0;
const fail = (what) => { if (++failures <= 12) console.log('FAIL: ' + what); };
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const procs = [];

function freePort() {
  return new Promise((resolve) => {
    const s = net.createServer().listen(0, '127.0.0.1', () => { const p = s.address().port; s.close(() => resolve(p)); });
  });
}

function startReplica(name) {
  const p = spawn(lmhost, ['serve', '--model', model, '--port', '0', '--threads', '1', '--parallel', '4',
    '--drain-delay', String(DRAIN), '--shutdown-grace', '30'],
  // (step-delay-ms: three engines on a small machine leave it some slack, so that health
  // checks are answered within their timeout)
  { stdio: ['ignore', 'ignore', 'pipe'], env: { ...process.env, LMHOST_DEBUG: 'step-delay-ms=4' } });
  procs.push(p);
  p.name = name;
  p.log = '';
  p.exited = new Promise((r) => p.on('exit', (code, sig) => { p.exitAt = Date.now(); r(code ?? sig); }));
  return new Promise((resolve, reject) => {
    const t = setTimeout(() => reject(new Error(`${name} did not start: ${p.log}`)), 60000);
    p.stderr.on('data', (d) => {
      p.log += d;
      const m = /serving \S+ on http:\/\/[^:]+:(\d+)/.exec(p.log);
      if (m && !p.port) { clearTimeout(t); p.port = Number(m[1]); resolve(p); }
    });
    p.exited.then((c) => { if (!p.port) reject(new Error(`${name} exited ${c}: ${p.log}`)); });
  });
}

// The example's sections, with loopback binds and servers, faster checks, and a log line
// per request that the test reads.
function haproxyConfig(port, replicas) {
  const out = [];
  let section = '';
  const endSection = () => { // servers after default-server, which applies to later lines only
    if (section === 'frontend') out.push('    log-format "lb id=%[capture.req.hdr(0)] srv=%s status=%ST term=%tsc retries=%rc"');
    if (section === 'backend') {
      out.push('    timeout check 1s');
      for (const r of replicas) out.push(`    server ${r.name} 127.0.0.1:${r.port}`);
    }
  };
  const need = ['balance leastconn', 'option httpchk GET /health', 'http-check expect status 200', 'option http-buffer-request',
    'retry-on conn-failure empty-response 503', 'option redispatch', 'retries ', 'timeout server', 'timeout tunnel'];
  for (const n of need) if (!example.includes('\n    ' + n)) fail(`examples/deploy/haproxy.cfg lacks '${n}'`);
  for (const line of example.split('\n')) {
    if (/^\s*(#|$)/.test(line)) continue;
    if (/^\S/.test(line)) {
      endSection();
      section = line.split(/\s+/)[0];
      out.push(line);
      continue;
    }
    const l = line.replace(/\s+#.*$/, '');
    if (section === 'global' && /^\s*maxconn /.test(l)) { out.push('    maxconn 1000'); continue; } // the test's open-file limit
    if (section === 'frontend' && /^\s*bind /.test(l)) { out.push(`    bind 127.0.0.1:${port}`); continue; }
    if (section === 'backend' && /^\s*server /.test(l)) continue;
    if (section === 'backend' && /^\s*default-server /.test(l)) {
      out.push(l.replace(/inter \S+/, 'inter 250').replace(/fall \d+/, 'fall 2').replace(/rise \d+/, 'rise 1'));
      continue;
    }
    out.push(l);
  }
  endSection();
  return out.join('\n') + '\n';
}

// One chat completion through the balancer; the outcome, whatever happens to it.
const agent = new http.Agent({ keepAlive: true, maxSockets: CLIENTS });
function chat(port, id, k, stream) {
  const body = JSON.stringify({ messages: [{ role: 'user', content: PROMPTS[k] }], max_tokens: MAX_TOKENS, temperature: 0, stream });
  const r = { id, k, stream, t0: Date.now(), status: 0, text: null, finish: null, complete: false, error: null };
  return new Promise((resolve) => {
    let settled = false;
    const done = () => { if (!settled) { settled = true; r.t1 = Date.now(); resolve(r); } };
    const req = http.request({ host: '127.0.0.1', port, path: '/v1/chat/completions', method: 'POST', agent,
      headers: { 'Content-Type': 'application/json', 'X-Request-Id': id, 'Content-Length': Buffer.byteLength(body) } }, (res) => {
      r.status = res.statusCode;
      let data = '';
      res.setEncoding('utf8');
      res.on('data', (d) => { data += d; });
      res.on('error', (e) => { r.error = r.error || String(e.message); });
      res.on('close', () => {
        r.raw = data;
        try {
          if (r.status !== 200) throw new Error(`status ${r.status}: ${data.slice(0, 200)}`);
          if (stream) {
            const events = data.split('\n\n').filter((e) => e.startsWith('data: ')).map((e) => e.slice(6));
            if (events[events.length - 1] !== '[DONE]') throw new Error(`stream cut after ${events.length} events`);
            const chunks = events.slice(0, -1).map((e) => JSON.parse(e));
            r.text = chunks.map((c) => c.choices[0]?.delta?.content ?? '').join('');
            r.finish = chunks.map((c) => c.choices[0]?.finish_reason).find((f) => f);
          } else {
            const j = JSON.parse(data);
            r.text = j.choices[0].message.content;
            r.finish = j.choices[0].finish_reason;
          }
          r.complete = res.complete && r.finish !== undefined;
        } catch (e) {
          r.error = r.error || String(e.message);
        }
        done();
      });
    });
    req.setTimeout(60000, () => req.destroy(new Error('timed out')));
    req.on('error', (e) => { r.error = r.error || String(e.message); done(); });
    req.end(body);
  });
}

async function main() {
  // the example as shipped, with a certificate where it names one
  execFileSync('openssl', ['req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes',
    '-keyout', path.join(tmp, 'key.pem'), '-out', path.join(tmp, 'cert.pem'), '-days', '1', '-subj', '/CN=localhost'], { stdio: 'ignore' });
  fs.writeFileSync(path.join(tmp, 'lmhost.pem'), fs.readFileSync(path.join(tmp, 'cert.pem')) + fs.readFileSync(path.join(tmp, 'key.pem')));
  fs.writeFileSync(path.join(tmp, 'example.cfg'), example.replace(/crt \S+/, `crt ${path.join(tmp, 'lmhost.pem')}`));
  try {
    execFileSync(haproxy, ['-c', '-q', '-f', path.join(tmp, 'example.cfg')], { stdio: 'pipe' });
  } catch (e) {
    fail('haproxy -c on examples/deploy/haproxy.cfg: ' + (e.stderr || e.stdout || e));
  }

  const [A, B, C] = await Promise.all(['A', 'B', 'C'].map(startReplica));
  // each prompt alone, from C directly: the answer every replica must give under load
  const solo = [];
  for (let k = 0; k < PROMPTS.length; k++) {
    const r = await chat(C.port, `solo-${k}`, k, false);
    if (!r.complete) throw new Error(`solo answer ${k}: ${r.error}`);
    solo.push(r);
  }

  const port = await freePort();
  fs.writeFileSync(path.join(tmp, 'haproxy.cfg'), haproxyConfig(port, [A, B, C]));
  const lb = spawn(haproxy, ['-db', '-f', path.join(tmp, 'haproxy.cfg')], { stdio: ['ignore', 'pipe', 'pipe'] });
  procs.push(lb);
  let lbLog = '';
  lb.stdout.on('data', (d) => { lbLog += d; });
  lb.stderr.on('data', (d) => { lbLog += d; });
  const lbExit = new Promise((r) => lb.on('exit', (c, s) => r(c ?? s)));
  for (let i = 0; ; i++) { // up once every replica has been checked
    const r = await chat(port, `warm-${i}`, 0, false);
    if (r.complete) break;
    if (i > 50) throw new Error('haproxy does not answer: ' + r.error + '\n' + lbLog);
    await sleep(100);
  }
  await sleep(600);

  const t0 = Date.now(), results = [];
  let tTerm = 0, tKill = 0, inFlightAtKill = [];
  const outstanding = new Map();
  const clients = Array.from({ length: CLIENTS }, async (_, c) => {
    for (let n = 0; Date.now() - t0 < T_END; n++) {
      const id = `c${c}-${n}`, k = (c + n) % PROMPTS.length;
      const p = chat(port, id, k, (c + n) % 2 === 0);
      outstanding.set(id, p);
      const r = await p;
      outstanding.delete(id);
      results.push(r);
    }
  });
  const events = (async () => {
    await sleep(T_TERM);
    tTerm = Date.now();
    A.kill('SIGTERM');
    await sleep(T_KILL - T_TERM);
    tKill = Date.now();
    inFlightAtKill = [...outstanding.keys()];
    B.kill('SIGKILL');
  })();
  await Promise.all([...clients, events]);
  const aCode = await A.exited;
  await sleep(300); // HAProxy logs a request when it ends
  agent.destroy();
  lb.kill('SIGUSR1'); // a soft stop, once the clients' connections are gone
  await Promise.race([lbExit, sleep(3000)]);

  // which replica HAProxy had each request on (the last one tried)
  const srv = new Map(), retried = new Map();
  for (const m of lbLog.matchAll(/lb id=(\S+) srv=(\S+) status=(-?\d+) term=(\S+) retries=(\+?)(\d+)/g)) {
    srv.set(m[1], m[2]);
    if (Number(m[6]) > 0) retried.set(m[1], m[5] + m[6]);
  }
  const failed = results.filter((r) => !r.complete);
  // in flight on B when it was killed: what HAProxy ended on B, or retried (from B: A still
  // served everything then)
  const onB = new Set(inFlightAtKill.filter((id) => srv.get(id) === 'B' || retried.has(id)));
  const bWhole = results.filter((r) => onB.has(r.id) && !r.stream);
  const counts = { A: 0, B: 0, C: 0, none: 0 };
  for (const r of results) counts[srv.get(r.id) ?? 'none']++;

  if (aCode !== 0) fail(`replica A exited ${aCode} after SIGTERM: ${A.log.slice(-400)}`);
  if (A.exitAt - tTerm < DRAIN * 1000 - 100) fail(`replica A exited ${A.exitAt - tTerm} ms after SIGTERM, before its --drain-delay`);
  for (const r of results.filter((x) => srv.get(x.id) === 'A' && !x.complete)) fail(`A accepted ${r.id} and did not answer it in full: ${r.error}`);
  for (const r of failed) {
    if (srv.get(r.id) !== 'B' || !onB.has(r.id))
      fail(`${r.id} failed and was not in flight on B when it was killed (HAProxy: ${srv.get(r.id) ?? 'no log'}): ${r.error}`);
  }
  if (failed.length > onB.size) fail(`${failed.length} failures, more than the ${onB.size} requests in flight on B`);
  for (const r of results.filter((x) => x.complete)) {
    const s = solo[r.k];
    if (r.text !== s.text || r.finish !== s.finish)
      fail(`${r.id} (${r.stream ? 'streamed' : 'whole'}, via ${srv.get(r.id)}): ${JSON.stringify(r.text)} ${r.finish}, alone ${JSON.stringify(s.text)} ${s.finish}`);
  }
  const late = results.filter((r) => r.t0 > tKill + SETTLE);
  const lateElsewhere = late.filter((r) => srv.get(r.id) !== 'C');
  if (!late.length) fail('no request began after the kill had been noticed');
  if (lateElsewhere.length) fail(`${lateElsewhere.length} of ${late.length} requests begun ${SETTLE} ms after the kill went elsewhere than C: ${lateElsewhere.slice(0, 3).map((r) => `${r.id} ${srv.get(r.id)}`).join(', ')}`);
  const early = results.filter((r) => r.t1 < tTerm);
  for (const n of ['A', 'B', 'C']) if (!early.some((r) => srv.get(r.id) === n)) fail(`replica ${n} served nothing before the events`);
  const aDuringDelay = results.filter((r) => srv.get(r.id) === 'A' && r.t0 > tTerm).length;
  if (counts.none > failed.length) fail(`${counts.none} requests not in HAProxy's log`);

  const why = failed.length ? `${failed.filter((r) => r.stream).length} streams cut, ${failed.filter((r) => !r.stream).length} whole: ` +
    failed.map((r) => `${r.id} ${r.error.slice(0, 60)}`).slice(0, 3).join('; ') : 'none';
  console.log(`haproxy-replicas: ${results.length} requests (${results.filter((r) => r.stream).length} streamed), ` +
    `A ${counts.A} (${aDuringDelay} after its SIGTERM, exit ${aCode}), B ${counts.B}, C ${counts.C}; ` +
    `${inFlightAtKill.length} in flight at the kill, ${onB.size} of them on B (${bWhole.length} whole, ` +
    `${bWhole.filter((r) => r.complete).length} of those retried elsewhere in full); ${retried.size} retried by HAProxy; ` +
    `${late.length} begun after the kill was noticed, all on C: ${lateElsewhere.length === 0}; ` +
    `${failed.length} failures (${why}); ${failures} check failures`);
  if (failures) console.log(lbLog.split('\n').filter((l) => /Server |Proxy /.test(l) && !/^lb id=/.test(l)).slice(0, 20).join('\n'));
}

try {
  await main();
} catch (e) {
  fail(String(e.stack || e));
} finally {
  for (const p of procs) if (p.exitCode === null && p.signalCode === null) p.kill('SIGKILL');
  agent.destroy();
  fs.rmSync(tmp, { recursive: true, force: true });
}
process.exit(failures ? 1 : 0);
