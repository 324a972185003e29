// The llama.cpp side of bench/peer.sh and bench/peer_ab.sh (node-llama-cpp), copied into
// bench/.peer/npm/ next to its node_modules: node peer_bench.mjs MODEL PP TG REPS THREADS MMAP(0|1)
import {getLlama, LlamaLogLevel} from "node-llama-cpp";
const [modelPath, P, N, R, T, M] = [process.argv[2], +process.argv[3], +process.argv[4], +process.argv[5], +process.argv[6], process.argv[7] === "1"];
const llama = await getLlama({gpu: false, build: "never", maxThreads: T, logLevel: LlamaLogLevel.warn, progressLogs: false});
console.error(`node-llama-cpp: gpu=${llama.gpu} build=${llama.buildType} cpuMathCores=${llama.cpuMathCores} bindings ${llama.llamaCppRelease?.release ?? "?"}`);
let t0 = performance.now();
const model = await llama.loadModel({modelPath, gpuLayers: 0, useMmap: M});
try { const fs = await import("fs"); const m = fs.readFileSync("/proc/self/maps", "utf8").match(/libggml-cpu-[\w.-]+\.so/);
  console.error(`ggml CPU backend: ${m ? m[0] : "?"}`); } catch (e) {}
console.error(`loaded ${modelPath} in ${((performance.now() - t0) / 1000).toFixed(2)} s; size ${model.size} bytes; useMmap ${M}`);
let seed = 12345;
const rnd = () => (seed = (seed * 1103515245 + 12345) % 2147483648) % 131000;
const ctx = await model.createContext({contextSize: Math.max(1024, P + N + 16), batchSize: 512,
  threads: {ideal: T, min: T}, sequences: 1, flashAttention: false});
console.error(`context: size ${ctx.contextSize}, batch ${ctx.batchSize}, threads ${ctx.idealThreads}, flash attention ${ctx.flashAttention}`);
async function run(p, n) {
  let seq = ctx.getSequence();
  const toks = Array.from({length: p}, rnd);
  let a = performance.now();
  await seq.evaluateWithoutGeneratingNewTokens(toks);
  const pp = (performance.now() - a) / 1000;
  seq.dispose();
  // tg on an empty sequence, as llama-bench's tg and dory bench's (without -d) run
  seq = ctx.getSequence();
  let got = 0;
  a = performance.now();
  for await (const tok of seq.evaluate([rnd()], {temperature: 0, yieldEogToken: true})) {
    if (++got >= n) break;
  }
  const tg = (performance.now() - a) / 1000;
  seq.dispose();
  return {pp, tg, got};
}
await run(16, 4);
const pps = [], tgs = [];
for (let r = 0; r < R; r++) {
  const {pp, tg, got} = await run(P, N);
  pps.push(P / pp); tgs.push(got / tg);
  console.error(`  rep ${r + 1}/${R}: pp${P} ${pp.toFixed(2)} s (${(P / pp).toFixed(2)} t/s), tg${N} ${tg.toFixed(2)} s (${(got / tg).toFixed(2)} t/s, ${got} tokens)`);
}
const ms = (x) => { const m = x.reduce((s, v) => s + v, 0) / x.length;
  const sd = x.length > 1 ? Math.sqrt(x.reduce((s, v) => s + (v - m) ** 2, 0) / (x.length - 1)) : 0; return [m, sd]; };
const [pm, ps] = ms(pps), [tm, ts] = ms(tgs);
console.log(`RESULT pp ${pm.toFixed(3)} ${ps.toFixed(3)} tg ${tm.toFixed(3)} ${ts.toFixed(3)}`);
await ctx.dispose(); await model.dispose(); await llama.dispose();
