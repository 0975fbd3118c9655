// Times the serde probe against body_scan (and body_scan fed in 64 KB pieces) inside V8 (node), on the same bodies as
// body_probe.rs. Usage: node policy/examples/v8_probe.mjs path/to/v8_probe.wasm
import { readFileSync } from 'node:fs';

const wasm = readFileSync(process.argv[2]);
const { instance } = await WebAssembly.instantiate(wasm, {});
const e = instance.exports;

// Same shapes as body_probe.rs (key order differs: serde_json sorts keys, JS keeps them).
const turn = { role: 'user', content: 'Refactor the parser so that it reports the line and column of every error it finds; keep the tests green.' };
const conversation = (size) => {
  const n = Math.max(1, Math.floor((size - 80) / (JSON.stringify(turn).length + 1)));
  return JSON.stringify({ model: 'haiku', max_tokens: 16, stream: true, messages: Array(n).fill(turn) });
};
const tool = (i) => ({
  name: `tool_${i}`, description: 'Run a command in the workspace and return its output.',
  input_schema: { type: 'object', additionalProperties: false, required: ['command', 'timeout'], properties: {
    command: { type: 'string', description: 'The command line.' },
    timeout: { type: 'integer', minimum: 0, maximum: 600000 },
    env: { type: 'object', additionalProperties: { type: 'string' } },
    mode: { enum: ['read', 'write', 'exec', null], default: 'read' },
    paths: { type: 'array', items: { type: 'object', properties: {
      path: { type: 'string' }, line: { type: 'number' }, flags: { type: 'array', items: { type: 'boolean' } } } } } } },
});
const tools = JSON.stringify({ model: 'sonnet', max_tokens: 4096, tools: Array.from({ length: 400 }, (_, i) => tool(i)), messages: [{ role: 'user', content: 'hi' }] });

const cases = [['conversation 4 KB', conversation(4096)], ['conversation 100 KB', conversation(102400)],
  ['conversation 1 MB', conversation(1048576)], ['tool schemas', tools]];
console.log('| body                | bytes     | serde probe | body_scan | speedup | 64 KB pieces | pieces/scan |');
console.log('|---------------------|----------:|------------:|----------:|--------:|-------------:|------------:|');
for (const [name, text] of cases) {
  const body = new TextEncoder().encode(text);
  const ptr = e.buffer(body.length);
  new Uint8Array(e.memory.buffer, ptr, body.length).set(body);
  const iters = Math.max(3, Math.floor(20e6 / body.length));
  const best = [Infinity, Infinity, Infinity];
  for (const kind of [0, 1, 2]) e.run(kind, ptr, body.length, iters * 3); // V8 tier-up
  // Alternate the probes; keep each one's best batch (other load on the machine only adds).
  for (let round = 0; round < 15; round++) {
    for (const kind of [0, 1, 2]) {
      const t = performance.now();
      if (e.run(kind, ptr, body.length, iters) === 0) throw new Error(`${name}: probe ${kind} refused`);
      best[kind] = Math.min(best[kind], ((performance.now() - t) * 1000) / iters);
    }
  }
  console.log(`| ${name.padEnd(19)} | ${String(body.length).padStart(9)} | ${best[0].toFixed(1).padStart(8)} us | ${best[1].toFixed(1).padStart(6)} us | ${(best[0] / best[1]).toFixed(1).padStart(6)}x | ${best[2].toFixed(1).padStart(9)} us | ${(best[2] / best[1]).toFixed(2).padStart(11)} |`);
}
