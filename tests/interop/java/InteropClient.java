import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Map;

import org.apache.rocketmq.client.consumer.DefaultMQPushConsumer;
import org.apache.rocketmq.client.consumer.listener.ConsumeConcurrentlyStatus;
import org.apache.rocketmq.client.consumer.listener.MessageListenerConcurrently;
import org.apache.rocketmq.client.impl.consumer.ProcessQueue;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.client.producer.SendResult;
import org.apache.rocketmq.client.producer.SendStatus;
import org.apache.rocketmq.common.consumer.ConsumeFromWhere;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.common.message.MessageExt;
import org.apache.rocketmq.common.message.MessageQueue;

/**
 * A real RocketMQ producer / push consumer for the interop tests (compiled at test time against the cached
 * jars of the line under test; the API used here is the same in 4.9.x and 5.x).
 *
 *   produce NAMESRV TOPIC COUNT GROUP [INTERVAL_MS] [PREFIX]   sync sends; one line per send, then DONE
 *   consume NAMESRV TOPIC GROUP INSTANCE                        push consumer; RECV lines, QUEUES every 500 ms
 *
 * Lines (stdout, flushed): "SENT key broker queueId msgId", "FAIL key exceptionClass message",
 * "DONE sent=N failed=M", "RECV key broker queueId msgId", "QUEUES broker:queueId,...", "READY".
 */
public class InteropClient {
    static synchronized void out(String line) {
        System.out.println(line);
        System.out.flush();
    }

    public static void main(String[] args) throws Exception {
        if (args.length < 1) {
            System.err.println("usage: produce|consume ...");
            System.exit(2);
        }
        if (args[0].equals("produce")) {
            produce(args);
        } else if (args[0].equals("consume")) {
            consume(args);
        } else {
            System.err.println("unknown mode " + args[0]);
            System.exit(2);
        }
    }

    static void produce(String[] a) throws Exception {
        String namesrv = a[1], topic = a[2], group = a[4];
        int count = Integer.parseInt(a[3]);
        long interval = a.length > 5 ? Long.parseLong(a[5]) : 0;
        String prefix = a.length > 6 ? a[6] : "m";
        DefaultMQProducer p = new DefaultMQProducer(group);
        p.setNamesrvAddr(namesrv);
        p.setInstanceName("producer-" + ProcessHandle.current().pid());
        p.setVipChannelEnabled(false);
        p.setPollNameServerInterval(Integer.getInteger("interop.pollNameServerInterval", 2000));
        p.setSendMsgTimeout(3000);
        p.setRetryTimesWhenSendFailed(2);
        p.start();
        out("READY");
        int sent = 0, failed = 0;
        for (int i = 0; i < count; i++) {
            String key = prefix + "-" + i;
            Message m = new Message(topic, "tag", key, ("body " + key).getBytes(StandardCharsets.UTF_8));
            try {
                SendResult r = p.send(m);
                if (r.getSendStatus() == SendStatus.SEND_OK) {
                    sent++;
                    out("SENT " + key + " " + r.getMessageQueue().getBrokerName() + " "
                        + r.getMessageQueue().getQueueId() + " " + r.getMsgId());
                } else {
                    failed++;
                    out("FAIL " + key + " status " + r.getSendStatus());
                }
            } catch (Exception e) {
                failed++;
                out("FAIL " + key + " " + e.getClass().getSimpleName() + " "
                    + String.valueOf(e.getMessage()).replace('\n', ' '));
            }
            if (interval > 0) {
                Thread.sleep(interval);
            }
        }
        out("DONE sent=" + sent + " failed=" + failed);
        p.shutdown();
    }

    static void consume(String[] a) throws Exception {
        String namesrv = a[1], topic = a[2], group = a[3], instance = a[4];
        DefaultMQPushConsumer c = new DefaultMQPushConsumer(group);
        c.setNamesrvAddr(namesrv);
        c.setInstanceName(instance);
        c.setVipChannelEnabled(false);
        c.setPollNameServerInterval(Integer.getInteger("interop.pollNameServerInterval", 2000));
        c.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
        c.subscribe(topic, "*");
        c.registerMessageListener((MessageListenerConcurrently) (msgs, ctx) -> {
            for (MessageExt m : msgs) {
                out("RECV " + m.getKeys() + " " + ctx.getMessageQueue().getBrokerName() + " "
                    + m.getQueueId() + " " + m.getMsgId());
            }
            return ConsumeConcurrentlyStatus.CONSUME_SUCCESS;
        });
        c.start();
        Runtime.getRuntime().addShutdownHook(new Thread(c::shutdown));
        out("READY");
        while (true) {
            List<String> owned = new ArrayList<>();
            Map<MessageQueue, ProcessQueue> table =
                c.getDefaultMQPushConsumerImpl().getRebalanceImpl().getProcessQueueTable();
            for (Map.Entry<MessageQueue, ProcessQueue> e : table.entrySet()) {
                if (!e.getValue().isDropped() && e.getKey().getTopic().equals(topic)) {
                    owned.add(e.getKey().getBrokerName() + ":" + e.getKey().getQueueId());
                }
            }
            Collections.sort(owned);
            out("QUEUES " + String.join(",", owned));
            Thread.sleep(500);
        }
    }
}
