//! A plan drawn as a layered DAG, laid out here so that the page only
//! places boxes: each step in the column after its latest dependency
//! (longest path from the steps that depend on nothing), steps in a column
//! ordered to keep edges short (a few barycenter sweeps), then coordinates.
//! Linear in steps and edges per sweep: a 1,000-step plan lays out in well
//! under a millisecond.

use std::collections::HashMap;

use serde::Serialize;

/// Width of a step's box.
pub const NODE_WIDTH: u32 = 190;
/// Height of a step's box.
pub const NODE_HEIGHT: u32 = 54;
const GAP_X: u32 = 60;
const GAP_Y: u32 = 18;
const MARGIN: u32 = 12;
const SWEEPS: usize = 4;

/// One step's place.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Placed {
    /// Step id.
    pub id: String,
    /// Column, from 0.
    pub layer: u32,
    /// Row within its column, from 0.
    pub order: u32,
    /// Left edge.
    pub x: u32,
    /// Top edge.
    pub y: u32,
}

/// A laid-out plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Layout {
    /// Steps, in the plan's order.
    pub nodes: Vec<Placed>,
    /// Dependencies as `[from, to]` indices into `nodes`.
    pub edges: Vec<[usize; 2]>,
    /// Size of the drawing.
    pub width: u32,
    /// Size of the drawing.
    pub height: u32,
    /// Box size, for the page.
    pub node_width: u32,
    /// Box size, for the page.
    pub node_height: u32,
}

/// Lays out steps given as `(id, depends_on)`, in plan order. A dependency
/// on an unknown step is ignored; steps caught in a cycle (never in a
/// validated plan) go to the last column.
pub fn layout<'a>(steps: impl IntoIterator<Item = (&'a str, &'a [String])>) -> Layout {
    let steps: Vec<(&str, &[String])> = steps.into_iter().collect();
    let index: HashMap<&str, usize> = steps.iter().enumerate().map(|(i, (id, _))| (*id, i)).collect();
    let mut edges = Vec::new();
    let mut predecessors: Vec<Vec<usize>> = vec![Vec::new(); steps.len()];
    let mut successors: Vec<Vec<usize>> = vec![Vec::new(); steps.len()];
    for (to, (_, depends_on)) in steps.iter().enumerate() {
        for dependency in *depends_on {
            if let Some(&from) = index.get(dependency.as_str())
                && from != to
            {
                edges.push([from, to]);
                predecessors[to].push(from);
                successors[from].push(to);
            }
        }
    }
    let layers = longest_path_layers(&predecessors, &successors);
    let columns = 1 + layers.iter().copied().max().unwrap_or(0);
    // Rows: plan order first, then sweeps towards the mean row of the neighbours.
    let mut by_layer: Vec<Vec<usize>> = vec![Vec::new(); columns as usize];
    for (node, &layer) in layers.iter().enumerate() {
        by_layer[layer as usize].push(node);
    }
    let mut row = vec![0f64; steps.len()];
    let renumber = |by_layer: &Vec<Vec<usize>>, row: &mut Vec<f64>| {
        for column in by_layer {
            for (r, &node) in column.iter().enumerate() {
                row[node] = r as f64;
            }
        }
    };
    renumber(&by_layer, &mut row);
    for sweep in 0..SWEEPS {
        let (neighbours, columns): (&Vec<Vec<usize>>, Box<dyn Iterator<Item = usize>>) = if sweep % 2 == 0 {
            (&predecessors, Box::new(1..by_layer.len()))
        } else {
            (&successors, Box::new((0..by_layer.len().saturating_sub(1)).rev()))
        };
        for column in columns {
            let mut keyed: Vec<(f64, usize)> = by_layer[column]
                .iter()
                .map(|&node| {
                    let around = &neighbours[node];
                    let key = if around.is_empty() {
                        row[node]
                    } else {
                        around.iter().map(|&n| row[n]).sum::<f64>() / around.len() as f64
                    };
                    (key, node)
                })
                .collect();
            keyed.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
            by_layer[column] = keyed.into_iter().map(|(_, node)| node).collect();
            for (r, &node) in by_layer[column].iter().enumerate() {
                row[node] = r as f64;
            }
        }
    }
    let tallest = by_layer.iter().map(Vec::len).max().unwrap_or(0) as u32;
    let mut nodes: Vec<Placed> =
        steps.iter().map(|(id, _)| Placed { id: (*id).to_owned(), layer: 0, order: 0, x: 0, y: 0 }).collect();
    for (layer, column) in by_layer.iter().enumerate() {
        // Each column centred on the tallest.
        let offset = (tallest - column.len() as u32) * (NODE_HEIGHT + GAP_Y) / 2;
        for (order, &node) in column.iter().enumerate() {
            let placed = &mut nodes[node];
            placed.layer = layer as u32;
            placed.order = order as u32;
            placed.x = MARGIN + layer as u32 * (NODE_WIDTH + GAP_X);
            placed.y = MARGIN + offset + order as u32 * (NODE_HEIGHT + GAP_Y);
        }
    }
    let width = if steps.is_empty() { 0 } else { 2 * MARGIN + columns * (NODE_WIDTH + GAP_X) - GAP_X };
    let height = if steps.is_empty() { 0 } else { 2 * MARGIN + tallest * (NODE_HEIGHT + GAP_Y) - GAP_Y };
    Layout { nodes, edges, width, height, node_width: NODE_WIDTH, node_height: NODE_HEIGHT }
}

/// Each node's column: one after its latest predecessor (Kahn's order);
/// nodes left in a cycle get the column after every other.
fn longest_path_layers(predecessors: &[Vec<usize>], successors: &[Vec<usize>]) -> Vec<u32> {
    let n = predecessors.len();
    let mut waiting: Vec<usize> = predecessors.iter().map(Vec::len).collect();
    let mut layer = vec![0u32; n];
    let mut ready: Vec<usize> = (0..n).filter(|&i| waiting[i] == 0).collect();
    let mut placed = vec![false; n];
    while let Some(node) = ready.pop() {
        placed[node] = true;
        for &next in &successors[node] {
            layer[next] = layer[next].max(layer[node] + 1);
            waiting[next] -= 1;
            if waiting[next] == 0 {
                ready.push(next);
            }
        }
    }
    let last = layer.iter().zip(&placed).filter(|(_, p)| **p).map(|(l, _)| *l).max().map_or(0, |l| l + 1);
    for (node, done) in placed.iter().enumerate() {
        if !done {
            layer[node] = last;
        }
    }
    layer
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(steps: &[(&str, &[&str])]) -> Vec<(String, Vec<String>)> {
        steps.iter().map(|(id, deps)| ((*id).to_owned(), deps.iter().map(|d| (*d).to_owned()).collect())).collect()
    }

    fn laid(steps: &[(String, Vec<String>)]) -> Layout {
        layout(steps.iter().map(|(id, deps)| (id.as_str(), deps.as_slice())))
    }

    #[test]
    fn each_step_sits_one_column_after_its_latest_dependency() {
        let steps = plan(&[("s1", &[]), ("s2", &[]), ("s3", &["s1"]), ("s4", &["s3", "s2"]), ("s5", &["s1"])]);
        let drawn = laid(&steps);
        let layers: Vec<u32> = drawn.nodes.iter().map(|n| n.layer).collect();
        assert_eq!(layers, [0, 0, 1, 2, 1]);
        assert_eq!(drawn.edges, [[0, 2], [2, 3], [1, 3], [0, 4]]);
        // No two steps share a place, and every box fits the drawing.
        let mut places: Vec<(u32, u32)> = drawn.nodes.iter().map(|n| (n.x, n.y)).collect();
        places.sort_unstable();
        places.dedup();
        assert_eq!(places.len(), 5);
        assert!(drawn.nodes.iter().all(|n| n.x + NODE_WIDTH <= drawn.width && n.y + NODE_HEIGHT <= drawn.height));
    }

    #[test]
    fn rows_follow_their_dependencies_to_avoid_crossings() {
        // b depends on y, a on x: listed crosswise, drawn parallel.
        let steps = plan(&[("x", &[]), ("y", &[]), ("b", &["y"]), ("a", &["x"])]);
        let drawn = laid(&steps);
        let row = |id: &str| drawn.nodes.iter().find(|n| n.id == id).map(|n| n.order);
        assert_eq!((row("a"), row("b")), (row("x"), row("y")));
    }

    #[test]
    fn empty_unknown_and_cyclic_plans_still_lay_out() {
        assert_eq!(laid(&[]).nodes.len(), 0);
        let unknown = laid(&plan(&[("s1", &["nope"]), ("s2", &["s1"])]));
        assert_eq!(unknown.edges, [[0, 1]]);
        let cycle = laid(&plan(&[("s1", &[]), ("a", &["b"]), ("b", &["a"])]));
        assert_eq!(cycle.nodes.iter().map(|n| n.layer).collect::<Vec<_>>(), [0, 1, 1]);
    }

    #[test]
    fn a_thousand_steps_lay_out() {
        // A fan-out of 998 between a start and an end.
        let mut steps = plan(&[("start", &[])]);
        for i in 0..998 {
            steps.push((format!("f{i}"), vec!["start".to_owned()]));
        }
        steps.push(("end".to_owned(), (0..998).map(|i| format!("f{i}")).collect()));
        let drawn = laid(&steps);
        assert_eq!(drawn.nodes.len(), 1000);
        assert_eq!(drawn.nodes.last().map(|n| n.layer), Some(2));
        assert_eq!(drawn.edges.len(), 998 * 2);
    }
}
