//! Pre-selection recall: does the right capability come out among the first
//! five candidates, ranked by words alone (BM25) or by words and meaning
//! (hybrid, with all-MiniLM-L6-v2 in process)?
//!
//! The catalog is generated: 50 kinds of things (invoices, parcels,
//! flights…) times 20 actions (create, cancel, track…), 1,000 capabilities
//! such as `cancel_invoice` "Cancels an invoice" on agent `invoice-service`.
//! Each request asks for one of them in three ways:
//! - **literal**: the description's own words ("Cancel the invoice for ACME");
//! - **verb paraphrased**: another verb, the same noun ("Call off the invoice…");
//! - **both paraphrased**: neither word of the description ("Call off the bill…").
//!
//! It prints recall@1, recall@5, recall@10 and the mean reciprocal rank for
//! each way of ranking and kind of request, and what ranking costs per
//! request (embedding the request included; the catalog's vectors are made
//! once, as the planner keeps them).
//!
//! `cargo run --release -p agentmesh-bench --bin preselect-bench`

use std::time::Instant;

use agentmesh_bench::{Latencies, print_table};
use agentmesh_core::hybrid::{self, capability_text};
use agentmesh_core::plan::AllowedCapability;
use agentmesh_llm::embeddings::{Embedder, MiniLm, default_local_dir, similarity};
use anyhow::Context;
use clap::Parser;

#[derive(Parser)]
struct Args {
    /// The all-MiniLM-L6-v2 directory (default: the planner's).
    #[arg(long)]
    model: Option<std::path::PathBuf>,
    /// Requests per kind (each asks for a different capability).
    #[arg(long, default_value_t = 200)]
    requests: usize,
}

/// Things: (id word, noun in descriptions, a paraphrase of the noun).
const THINGS: [(&str, &str, &str); 50] = [
    ("invoice", "invoice", "bill"),
    ("parcel", "parcel", "package"),
    ("flight", "flight", "plane ticket"),
    ("hotel", "hotel booking", "room reservation"),
    ("meeting", "meeting", "get-together"),
    ("email", "email", "message in my inbox"),
    ("contract", "contract", "signed agreement"),
    ("employee", "employee record", "staff member"),
    ("customer", "customer account", "client"),
    ("order", "purchase order", "shopping basket checkout"),
    ("ticket", "support ticket", "help desk case"),
    ("car", "car rental", "hired vehicle"),
    ("payment", "payment", "money transfer"),
    ("subscription", "subscription", "monthly plan"),
    ("recipe", "recipe", "cooking instructions"),
    ("song", "song", "music track"),
    ("photo", "photo", "picture"),
    ("document", "document", "paperwork"),
    ("password", "password", "login secret"),
    ("calendar", "calendar event", "appointment"),
    ("doctor", "doctor appointment", "visit to the physician"),
    ("prescription", "prescription", "medication refill"),
    ("loan", "loan", "borrowed money"),
    ("insurance", "insurance claim", "coverage request"),
    ("server", "server", "cloud machine"),
    ("database", "database", "data store"),
    ("backup", "backup", "saved copy of my files"),
    ("invitation", "invitation", "invite"),
    ("restaurant", "restaurant table", "dinner reservation"),
    ("movie", "movie ticket", "cinema seat"),
    ("train", "train ticket", "rail journey"),
    ("package", "software package", "library dependency"),
    ("repository", "code repository", "git project"),
    ("budget", "budget", "spending plan"),
    ("expense", "expense report", "reimbursement claim"),
    ("vacation", "vacation request", "time off"),
    ("shift", "work shift", "rota slot"),
    ("lesson", "lesson", "class session"),
    ("course", "course enrollment", "study programme"),
    ("library", "library book", "borrowed novel"),
    ("parking", "parking permit", "spot for my car"),
    ("pet", "pet record", "dog's vet file"),
    ("plant", "plant watering", "garden irrigation"),
    ("thermostat", "thermostat", "heating"),
    ("light", "light", "lamp"),
    ("alarm", "alarm", "wake-up call"),
    ("news", "news digest", "headlines"),
    ("weather", "weather alert", "storm warning"),
    ("stock", "stock portfolio", "shares I own"),
    ("crypto", "crypto wallet", "bitcoin holdings"),
];

/// Actions: (id verb, description verb, request verb, paraphrased verb).
const ACTIONS: [(&str, &str, &str, &str); 20] = [
    ("create", "Creates", "Create", "Set up"),
    ("cancel", "Cancels", "Cancel", "Call off"),
    ("list", "Lists", "List", "Show me all of"),
    ("get", "Gets the details of", "Get the details of", "Tell me about"),
    ("update", "Updates", "Update", "Change"),
    ("delete", "Deletes", "Delete", "Get rid of"),
    ("track", "Tracks the status of", "Track the status of", "Where is"),
    ("share", "Shares", "Share", "Send a link to"),
    ("archive", "Archives", "Archive", "Put away"),
    ("export", "Exports", "Export", "Download a spreadsheet of"),
    ("approve", "Approves", "Approve", "Give the green light to"),
    ("reject", "Rejects", "Reject", "Turn down"),
    ("schedule", "Schedules", "Schedule", "Plan for next week"),
    ("renew", "Renews", "Renew", "Extend"),
    ("search", "Searches", "Search", "Look for"),
    ("summarize", "Summarizes", "Summarize", "Give me the gist of"),
    ("translate", "Translates", "Translate", "Put into French"),
    ("remind", "Sets a reminder about", "Set a reminder about", "Nudge me later about"),
    ("audit", "Audits", "Audit", "Check for problems in"),
    ("restore", "Restores", "Restore", "Bring back"),
];

fn catalog() -> Vec<AllowedCapability> {
    let mut out = Vec::with_capacity(THINGS.len() * ACTIONS.len());
    for (thing, noun, _) in THINGS {
        for (verb, described, _, _) in ACTIONS {
            out.push(AllowedCapability::skill(
                &format!("{thing}-service"),
                &format!("{verb}_{thing}"),
                &format!("{described} a {noun}"),
            ));
        }
    }
    out
}

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Literal,
    Verb,
    Both,
}

impl Kind {
    fn label(self) -> &'static str {
        match self {
            Self::Literal => "literal",
            Self::Verb => "verb paraphrased",
            Self::Both => "both paraphrased",
        }
    }
}

/// `n` requests of a kind, each for a different capability (spread over
/// the catalog), with its index.
fn requests(kind: Kind, n: usize) -> Vec<(String, usize)> {
    let total = THINGS.len() * ACTIONS.len();
    (0..n.min(total))
        .map(|i| {
            // A stride coprime with 1,000 visits every capability once.
            let index = (i * 37 + 11) % total;
            let (thing, action) = (index / ACTIONS.len(), index % ACTIONS.len());
            let (_, noun, other_noun) = THINGS[thing];
            let (_, _, verb, other_verb) = ACTIONS[action];
            let request = match kind {
                Kind::Literal => format!("{verb} the {noun} for ACME, please"),
                Kind::Verb => format!("{other_verb} the {noun} for ACME, please"),
                Kind::Both => format!("{other_verb} the {other_noun} for ACME, please"),
            };
            (request, index)
        })
        .collect()
}

#[derive(Default, Clone)]
struct Recall {
    at1: usize,
    at5: usize,
    at10: usize,
    reciprocal: f64,
    n: usize,
}

impl Recall {
    fn add(&mut self, order: &[usize], right: usize) {
        self.n += 1;
        if let Some(pos) = order.iter().position(|&i| i == right) {
            self.at1 += usize::from(pos < 1);
            self.at5 += usize::from(pos < 5);
            self.at10 += usize::from(pos < 10);
            self.reciprocal += 1.0 / (pos as f64 + 1.0);
        }
    }

    fn row(&self, ranking: &str, kind: &str) -> Vec<String> {
        let pct = |x: usize| format!("{:.1} %", 100.0 * x as f64 / self.n.max(1) as f64);
        vec![
            ranking.into(),
            kind.into(),
            pct(self.at1),
            pct(self.at5),
            pct(self.at10),
            format!("{:.3}", self.reciprocal / self.n.max(1) as f64),
        ]
    }
}

#[tokio::main(flavor = "multi_thread")]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let dir = args.model.unwrap_or_else(default_local_dir);
    let model = MiniLm::load(&dir).with_context(|| format!("the model in {}", dir.display()))?;
    let catalog = catalog();
    let started = Instant::now();
    let texts: Vec<String> = catalog.iter().map(capability_text).collect();
    let vectors = model.embed(&texts).await?;
    let catalog_secs = started.elapsed().as_secs_f64();
    println!(
        "catalog: {} capabilities embedded in {catalog_secs:.1} s ({:.1} ms each), model {}\n",
        catalog.len(),
        1000.0 * catalog_secs / catalog.len() as f64,
        model.name()
    );
    let rankings = ["BM25 alone", "embeddings alone", "hybrid (RRF)", "hybrid (relevance: the planner's)"];
    let mut rows = Vec::new();
    let mut totals = vec![Recall::default(); rankings.len()];
    let (mut bm25_time, mut hybrid_time) = (Latencies::default(), Latencies::default());
    for kind in [Kind::Literal, Kind::Verb, Kind::Both] {
        let mut recalls = vec![Recall::default(); rankings.len()];
        for (request, right) in requests(kind, args.requests) {
            let t = Instant::now();
            let words: Vec<usize> = hybrid::rank(&request, &catalog, None).iter().map(|c| c.index).collect();
            bm25_time.record(t.elapsed());
            let t = Instant::now();
            let query = model.embed(std::slice::from_ref(&request)).await?;
            let similarities: Vec<f32> = vectors.iter().map(|v| similarity(&query[0], v)).collect();
            let both = hybrid::rank(&request, &catalog, Some(&similarities));
            hybrid_time.record(t.elapsed());
            let mut meaning: Vec<usize> = (0..catalog.len()).collect();
            meaning.sort_by(|&a, &b| similarities[b].total_cmp(&similarities[a]));
            // The planner's order (relevance), and reciprocal rank fusion for comparison.
            let relevance: Vec<usize> = both.iter().map(|c| c.index).collect();
            let mut by_rrf = both.clone();
            by_rrf.sort_by(|a, b| b.fused.total_cmp(&a.fused).then(a.index.cmp(&b.index)));
            let fused: Vec<usize> = by_rrf.iter().map(|c| c.index).collect();
            for (i, order) in [words, meaning, fused, relevance].iter().enumerate() {
                recalls[i].add(order, right);
                totals[i].add(order, right);
            }
        }
        for (i, r) in recalls.iter().enumerate() {
            rows.push(r.row(rankings[i], kind.label()));
        }
    }
    for (i, r) in totals.iter().enumerate() {
        rows.push(r.row(rankings[i], "all"));
    }
    print_table(&["ranking", "requests", "recall@1", "recall@5", "recall@10", "MRR"], &rows);
    println!();
    let ms = |l: &mut Latencies| vec![format!("{:.2}", l.percentile_ms(50.0)), format!("{:.2}", l.percentile_ms(95.0))];
    let mut cost = vec![vec!["BM25 alone".to_owned()], vec!["hybrid (request embedded + fusion)".to_owned()]];
    cost[0].extend(ms(&mut bm25_time));
    cost[1].extend(ms(&mut hybrid_time));
    print_table(&["ranking per request over 1,000 capabilities", "p50 ms", "p95 ms"], &cost);
    Ok(())
}
