// The chat page on a model with CMF skills (run by test_chat_page.py):
//   node skill_select.mjs URL CHROMIUM
// Prints one JSON object: the skill choices the page offers, then what it sent with "alt"
// chosen (the answer; the server's log says which skill ran).
import { launch, sleep } from "./browser.mjs";

const [url, chromium] = process.argv.slice(2);
const out = {};
const browser = await launch(chromium);
try {
  const page = await browser.newPage();
  const errors = [];
  page.on("pageerror", (e) => errors.push(String(e)));
  await page.goto(url, { waitUntil: "load" });
  await page.evaluate(() => localStorage.clear());
  await page.reload({ waitUntil: "load" });
  const t0 = Date.now();
  while (Date.now() - t0 < 10000 && (await page.$eval("#skillbox", (e) => e.hidden))) await sleep(20);
  out.skill_hidden = await page.$eval("#skillbox", (e) => e.hidden);
  out.options = await page.$$eval("#skill option", (o) => o.map((e) => e.value));
  await page.select("#skill", "alt");
  await page.evaluate(() => {
    document.getElementById("max_tokens").value = "8";
    document.getElementById("temperature").value = "0";
  });
  await page.click("#input");
  await page.keyboard.type("hello");
  await page.click("#send");
  const t1 = Date.now();
  await sleep(50);
  while (Date.now() - t1 < 30000 && !(await page.$eval("#stop", (e) => e.disabled))) await sleep(20);
  out.status = await page.$eval("#status", (e) => e.textContent);
  out.saved = await page.evaluate(() => localStorage.getItem("dory.skill"));
  out.page_errors = errors;
} finally {
  await browser.close();
}
console.log(JSON.stringify(out));
