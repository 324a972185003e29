// Drives headless Chromium through dory serve's chat page (run by test_chat_page.py):
//   node chat_page.mjs URL API_KEY SCREENSHOT.png CHROMIUM
// Prints one JSON object of what it saw; the Python test asserts on it.
import { launch, sleep } from "./browser.mjs";

const [url, key, shot, chromium] = process.argv.slice(2);
const out = {};

const browser = await launch(chromium);
try {
  const page = await browser.newPage();
  await page.setViewport({ width: 1100, height: 760 });
  const errors = [];
  page.on("pageerror", (e) => errors.push(String(e)));
  await page.goto(url, { waitUntil: "load" });
  await page.evaluate(() => localStorage.clear());
  await page.reload({ waitUntil: "load" });
  out.title = await page.title();

  // The Markdown renderer on a fixed text.
  out.markdown = await page.evaluate(() =>
    markdown("# Title\nSome **bold** and `x<y` code.\n\n```python\nif a < b:\n    pass\n```\n- one\n- two"));

  const lastReply = () =>
    page.evaluate(() => {
      const b = document.querySelectorAll(".msg.assistant .body");
      return b.length ? b[b.length - 1].textContent : "";
    });
  const busy = () => page.evaluate(() => !document.getElementById("stop").disabled);
  const setField = (id, v) =>
    page.evaluate(
      (id, v) => {
        const e = document.getElementById(id);
        e.value = v;
        e.dispatchEvent(new Event("change"));
      },
      id, v);
  async function ask(text) {
    await page.click("#input");
    await page.keyboard.type(text);
    await page.click("#send");
  }
  async function waitIdle(ms = 30000) {
    const t0 = Date.now();
    while (Date.now() - t0 < ms) {
      if (!(await busy())) return true;
      await sleep(20);
    }
    return false;
  }

  // 1. Without the key: the API refuses, the page says why.
  await ask("Hello there");
  await waitIdle();
  out.no_key_status = await page.$eval("#status", (e) => e.textContent);

  // 2. With the key, a slow link (DevTools throttling) so the answer visibly streams in.
  await setField("apikey", key);
  await setField("max_tokens", "48");
  await setField("temperature", "0");
  const cdp = await page.createCDPSession();
  await cdp.send("Network.enable");
  await cdp.send("Network.emulateNetworkConditions", {
    offline: false, latency: 0, downloadThroughput: 1500, uploadThroughput: 1e6,
  });
  await ask("The king said");
  const lengths = [];
  const t0 = Date.now();
  while (Date.now() - t0 < 60000) {
    const b = await busy();
    const n = (await lastReply()).length;
    if (b && n > 0 && lengths[lengths.length - 1] !== n) lengths.push(n);
    if (!b && Date.now() - t0 > 200) break;
    await sleep(25);
  }
  out.stream_lengths = lengths;
  out.answer = await lastReply();

  // 3. Stop one mid-stream.
  await setField("max_tokens", "400");
  await ask("Tell me a long story");
  const t1 = Date.now();
  while (Date.now() - t1 < 30000 && (await lastReply()).length < 3) await sleep(20);
  out.before_stop = (await lastReply()).length;
  await page.click("#stop");
  out.stop_idle = await waitIdle(5000);
  out.stop_status = await page.$eval("#status", (e) => e.textContent);
  const a = await lastReply();
  await sleep(700);
  out.stopped_len = a.length;
  out.after_wait_len = (await lastReply()).length;
  await cdp.send("Network.emulateNetworkConditions", {
    offline: false, latency: 0, downloadThroughput: -1, uploadThroughput: -1,
  });

  // 4. A new chat, then a reload: both conversations are still there (localStorage).
  await page.click("#new");
  out.chats_after_new = await page.$$eval(".chat-item", (e) => e.length);
  await page.reload({ waitUntil: "load" });
  out.chats_after_reload = await page.$$eval(".chat-item", (e) => e.length);
  await page.evaluate(() => document.querySelectorAll(".chat-item")[1].click());
  out.messages_after_reload = await page.$$eval(".msg", (e) => e.length);
  await page.screenshot({ path: shot });
  // The built-in model has no CMF skills: no skill choice.
  out.skill_hidden = await page.$eval("#skillbox", (e) => e.hidden);
  out.page_errors = errors;
} finally {
  await browser.close();
}
console.log(JSON.stringify(out));
