// An independent reader of TensorBoard event files, for tests/e2e/test_tensorboard.cpp: the
// TFRecord framing and its checksums through the npm package @roboflow/tfrecords, the Event
// messages through protobufjs with the schema below (written from TensorFlow's event.proto and
// summary.proto, not from tripod's). Shares no code with tripod's writer.
//
//   NODE_PATH=.../node_modules node tfevents_reader.js DIR
// prints {"files":[{"name":..., "events":[{"wall_time":..,"step":..,"file_version":..,
// "values":[[tag, value], ...]}]}]} (files in name order, NaN as null); exits 1 naming the file and
// offset of a bad length, checksum or message.
"use strict";
const fs = require("fs");
const path = require("path");
const protobuf = require("protobufjs");
const tfr = require("@roboflow/tfrecords/src/tensorFlowHelpers");

const schema = `
syntax = "proto3";
message SummaryValue {
  string node_name = 7;
  string tag = 1;
  oneof value { float simple_value = 2; bytes obsolete_old_style_histogram = 3; }
}
message Summary { repeated SummaryValue value = 1; }
message Event {
  double wall_time = 1;
  int64 step = 2;
  oneof what { string file_version = 3; bytes graph_def = 4; Summary summary = 5; }
}`;
const Event = protobuf.parse(schema, { keepCase: true }).root.lookupType("Event");

function fail(msg) {
  process.stderr.write(msg + "\n");
  process.exit(1);
}

function readFile(file) {
  const buf = fs.readFileSync(file);
  const events = [];
  let pos = 0;
  while (pos < buf.length) {
    if (buf.length - pos < 12) fail(`${file}: ${buf.length - pos} stray bytes at offset ${pos}`);
    const lenBytes = buf.slice(pos, pos + 8);
    const len = tfr.readInt64(lenBytes);
    if (tfr.maskCrc(tfr.crc32c(lenBytes)) !== buf.readUInt32LE(pos + 8)) fail(`${file}: bad length checksum at offset ${pos}`);
    const start = pos + 12;
    if (start + len + 4 > buf.length) fail(`${file}: record at offset ${pos} runs past the end`);
    const data = buf.slice(start, start + len);
    if (tfr.maskCrc(tfr.crc32c(data)) !== buf.readUInt32LE(start + len)) fail(`${file}: bad data checksum at offset ${pos}`);
    let e;
    try {
      e = Event.toObject(Event.decode(data), { longs: Number, oneofs: true });
    } catch (err) {
      fail(`${file}: record at offset ${pos} is not an Event (${err.message})`);
    }
    const out = { wall_time: e.wall_time === undefined ? 0 : e.wall_time, step: e.step === undefined ? 0 : e.step };
    if (e.file_version !== undefined) out.file_version = e.file_version;
    if (e.summary !== undefined)
      out.values = (e.summary.value || []).map((v) => [v.tag, v.simple_value === undefined ? null : v.simple_value]);
    events.push(out);
    pos = start + len + 4;
  }
  return events;
}

const dir = process.argv[2];
if (!dir) fail("usage: tfevents_reader.js DIR");
const names = fs.readdirSync(dir).filter((n) => n.includes("tfevents")).sort();
const files = names.map((name) => ({ name, events: readFile(path.join(dir, name)) }));
process.stdout.write(JSON.stringify({ files }) + "\n");
