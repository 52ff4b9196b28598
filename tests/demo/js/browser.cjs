// What the demo's browser scripts share: the machine's Chromium through playwright-core, with
// the flags a shared, offline machine needs (the profile is the test's own), and the one JSON
// argument in, one JSON object out.
'use strict';

const FLAGS = [
    '--headless',
    '--no-sandbox',
    '--disable-gpu',
    '--disable-background-networking',
    '--disable-component-update',
    '--disable-sync',
    '--no-first-run',
];

const input = JSON.parse(process.argv[2]);

// A browser context of its own; `viewport` as Playwright takes it (undefined: its default).
function launch(viewport) {
    const {chromium} = require(`${input.modules}/playwright-core`);
    return chromium.launchPersistentContext(input.profile, {
        executablePath: input.chromium,
        headless: true,
        args: FLAGS,
        viewport,
    });
}

// Runs `main(context)` in a fresh context, closed whatever happens; prints what it returns.
function run(main, viewport) {
    (async () => {
        const context = await launch(viewport);
        try {
            return await main(context);
        } finally {
            await context.close();
        }
    })().then(
        (out) => process.stdout.write(JSON.stringify(out)),
        (err) => {
            process.stderr.write(`${err.stack || err}\n`);
            process.exit(1);
        },
    );
}

module.exports = {input, run, wait: {timeout: input.wait_ms}};
