// The official WebSocketClient against the fake: hello, a `posted` event whose data.post is a
// JSON string, and a resume (connection_id, sequence_number) after the socket dropped, with an
// event missed meanwhile. Input: one JSON argument; output: one JSON object.
'use strict';
const {Client4, WebSocketClient} = require('@mattermost/client');

// Node 20 has WebSocket behind --experimental-websocket, and no CloseEvent, which the client
// builds when it closes a socket itself.
globalThis.CloseEvent ??= class CloseEvent extends Event {
    constructor(type, init = {}) {
        super(type);
        this.code = init.code;
        this.reason = init.reason ?? '';
        this.wasClean = init.wasClean ?? false;
    }
};

// The client logs to the console; stdout carries only the result.
console.log = (...args) => process.stderr.write(`${args.join(' ')}\n`);

const input = JSON.parse(process.argv[2]);
const urls = [];
const frames = [];
const events = [];
let missed = 0;

function until(what, condition, timeoutMs = 10000) {
    const started = Date.now();
    return new Promise((resolve, reject) => {
        const check = () => {
            if (condition()) {
                resolve();
            } else if (Date.now() - started > timeoutMs) {
                reject(new Error(`timed out waiting for ${what}`));
            } else {
                setTimeout(check, 10);
            }
        };
        check();
    });
}

function alicePosts(message) {
    const alice = new Client4();
    alice.setUrl(input.url);
    alice.setToken(input.alice_token);
    return alice.createPost({channel_id: input.dev_id, message});
}

async function main() {
    const socket = new WebSocketClient({
        newWebSocketFn: (url) => {
            urls.push(url);
            const init = input.header ? {headers: {Authorization: `Bearer ${input.bot_token}`}} : undefined;
            const conn = new WebSocket(url, init);
            conn.addEventListener('message', (evt) => frames.push(JSON.parse(evt.data)));
            return conn;
        },
        minWebSocketRetryTime: 50,
        reconnectJitterRange: 0,
        clientPingInterval: 60000,
    });
    socket.addMessageListener((msg) => events.push(msg));
    socket.addMissedMessageListener(() => missed++);
    socket.initialize(input.ws_url, input.bot_token);
    await until('hello', () => events.some((e) => e.event === 'hello'));
    const connectionId = socket.connectionId;

    const first = await alicePosts('the first post');
    await until('the first posted', () => events.some((e) => e.event === 'posted'));

    socket.conn.close(); // the client reconnects by itself, asking to resume
    const second = await alicePosts('a post while the socket is down');
    await until('the reconnect', () => urls.length === 2);
    await until('the missed posted', () => events.filter((e) => e.event === 'posted').length === 2);
    await until('a ping reply', () => frames.some((f) => f.seq_reply === 1 || f.seq_reply === 2));
    socket.close();

    return {
        urls,
        connection_id: connectionId,
        connection_id_after: socket.connectionId,
        events: events.map((e) => ({event: e.event, seq: e.seq, data: e.data})),
        replies: frames.filter((f) => 'seq_reply' in f),
        missed,
        posted_ids: [first.id, second.id],
    };
}

main().then(
    (out) => process.stdout.write(JSON.stringify(out), () => process.exit(0)),
    (err) => {
        process.stderr.write(`${err.stack || err}\n${JSON.stringify({urls, frames})}\n`);
        process.exit(1);
    },
);
