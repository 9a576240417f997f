// What every browser script of tests/browser shares: its command line
//   node SCRIPT.mjs SCENARIO '{"url", "token", "chromium", "failureScreenshot", ...scenario params}'
// headless Chromium launched the way this machine needs, pages at 1280 x 800 whose every wait has
// a deadline, and the run: the scenario's result as the last line of stdout (a JSON object for the
// Python side to check), or a screenshot of the page where it failed.

import { chromium } from 'playwright-core';

const [scenario, settingsJson] = process.argv.slice(2);
export const settings = JSON.parse(settingsJson);
export const STEP_TIMEOUT = 60_000;

// Flags for headless Debian Chromium as root in a container (FIELD-NOTES, "Jupyter").
const CHROMIUM_FLAGS = [
  '--headless',
  '--no-sandbox',
  '--disable-gpu',
  '--no-first-run',
  '--disable-background-networking',
  '--disable-component-update',
  '--disable-sync'
];

let currentPage = null; // for the screenshot of a failed step

/** A page 1280 px wide whose steps time out after STEP_TIMEOUT; the one a failure shows. */
export async function newPage(browser) {
  const page = await browser.newPage({ viewport: { width: 1280, height: 800 } });
  currentPage = page;
  page.setDefaultTimeout(STEP_TIMEOUT);
  return page;
}

/** Run the scenario named on the command line, one of `scenarios` (name -> async (browser) => result). */
export async function runScenario(scenarios) {
  const browser = await chromium.launch({ executablePath: settings.chromium, args: CHROMIUM_FLAGS });
  try {
    console.log(JSON.stringify(await scenarios[scenario](browser)));
  } catch (error) {
    await currentPage?.screenshot({ path: settings.failureScreenshot });
    throw error;
  } finally {
    await browser.close();
  }
}
